#include "tests/support/thread_ranks.h"

#include <string>
#include <thread>

namespace cofab::testing {

std::vector<Status> runThreadRanks(int n, const std::function<Status(int rank)>& fn) {
  std::vector<Status> out(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] { out[static_cast<size_t>(r)] = fn(r); });
  }
  for (auto& t : threads) t.join();
  return out;
}

Status allOk(const std::vector<Status>& statuses) {
  Status first;
  std::string others;
  for (size_t r = 0; r < statuses.size(); ++r) {
    if (statuses[r].ok()) continue;
    if (first.ok()) {
      first = statuses[r].withContext("rank " + std::to_string(r));
    } else {
      others += "; rank " + std::to_string(r) + ": " + statuses[r].toString();
    }
  }
  if (first.ok() || others.empty()) return first;
  return Status(first.code(), first.message() + others);
}

}  // namespace cofab::testing
