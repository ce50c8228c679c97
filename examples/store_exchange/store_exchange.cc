// store_exchange: N ranks meet through the rendezvous store, exchange data and check it.
//
// Each rank publishes a block of bytes derived from its rank, reads every other rank's block,
// verifies it byte for byte, then all ranks pass a store barrier and rank 0 prints a summary.
// This is the smallest complete cofab job: bootstrap from the launcher's environment, a
// TcpStore, deadlines on every wait.
//
//   cofab-run -n 4 -- ./build/examples/store_exchange/store_exchange --bytes 1048576
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/clock.h"
#include "core/param.h"
#include "fabric/rendezvous/bootstrap.h"

namespace {

cofab::Bytes blockFor(int rank, size_t bytes) {
  cofab::Bytes b(bytes);
  uint32_t x = 2166136261u ^ static_cast<uint32_t>(rank);
  for (auto& v : b) {
    x = x * 16777619u + 12345u;
    v = static_cast<uint8_t>(x >> 24);
  }
  return b;
}

// Exit code 1 for a failed job, 2 for a usage error.
int fail(const cofab::Status& s, int code = 1) {
  std::fprintf(stderr, "store_exchange: %s\n", s.toString().c_str());
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  size_t bytes = 1 << 20;
  int64_t timeoutMs = 30000;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    // Strict, with a range: strtoull read "abc" as 0, and the job reported OK having sent nothing.
    if (a == "--bytes" && i + 1 < argc) {
      auto v = cofab::parseIntIn(argv[++i], "--bytes", 0,
                                 static_cast<int64_t>(cofab::kMaxStoreValueBytes));
      if (!v.ok()) return fail(v.status(), 2);
      bytes = static_cast<size_t>(*v);
    } else if (a == "--timeout-ms" && i + 1 < argc) {
      auto v = cofab::parseIntIn(argv[++i], "--timeout-ms", 1, int64_t{24} * 3600 * 1000);
      if (!v.ok()) return fail(v.status(), 2);
      timeoutMs = *v;
    } else {
      std::fprintf(stderr, "usage: store_exchange [--bytes N] [--timeout-ms MS]\n");
      return 2;
    }
  }
  auto start = std::chrono::steady_clock::now();
  auto deadline = cofab::Deadline::afterMs(timeoutMs);
  auto boot = cofab::bootstrapFromEnv(deadline);
  if (!boot.ok()) return fail(boot.status());
  const int rank = boot->info.rank, size = boot->info.worldSize;
  cofab::Store& store = *boot->store;
  std::printf("rank %d/%d joined %s (via %s variables)\n", rank, size, store.describe().c_str(),
              boot->info.source.c_str());

  if (auto s = store.set("exchange/" + std::to_string(rank), blockFor(rank, bytes)); !s.ok()) {
    return fail(s);
  }
  size_t verified = 0;
  for (int peer = 0; peer < size; ++peer) {
    auto got = store.get("exchange/" + std::to_string(peer), deadline);
    if (!got.ok()) return fail(got.status().withContext("reading rank " + std::to_string(peer)));
    if (*got != blockFor(peer, bytes)) {
      return fail(cofab::DataLoss("rank " + std::to_string(peer) + "'s block is corrupted"));
    }
    verified += got->size();
  }
  // Barrier: everyone has verified everything before anyone reports success.
  auto arrived = store.add("exchange/arrived", 1);
  if (!arrived.ok()) return fail(arrived.status());
  if (*arrived == size) (void)store.set("exchange/all-verified", {});
  if (auto s = store.wait({"exchange/all-verified"}, deadline); !s.ok()) return fail(s);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("rank %d verified %zu bytes from %d ranks in %.3f s\n", rank, verified, size, secs);
  if (rank == 0) {
    std::printf("store_exchange: OK — %d ranks exchanged %zu-byte blocks through %s\n", size,
                bytes, store.describe().c_str());
  }
  return 0;
}
