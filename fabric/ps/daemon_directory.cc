#include "fabric/ps/daemon_directory.h"

#include "fabric/ps/ps_protocol.h"

namespace cofab::ps {

StatusOr<std::vector<std::string>> discoverDaemons(Store& store, const std::string& prefix,
                                                   Deadline deadline) {
  const std::string countKey = serverCountKey(prefix);
  auto countBytes = store.get(countKey, deadline);
  if (!countBytes.ok()) {
    return countBytes.status().withContext(
        "no aggregator daemon registered under '" + prefix +
        "' (start cofab-aggd, e.g. cofab-run --role agg:1:cofab-aggd)");
  }
  COFAB_ASSIGN_OR_RETURN(int64_t m, parseCounter(countKey, countBytes.value()));
  if (m <= 0 || m > kMaxDaemons) {
    return InvalidArgument("store key '" + countKey + "' holds " + std::to_string(m) +
                           ", not a daemon count (1.." + std::to_string(kMaxDaemons) + ")");
  }
  std::vector<std::string> keys;
  for (int i = 0; i < m; ++i) keys.push_back(serverAddressKey(prefix, i));
  COFAB_RETURN_IF_ERROR(store.wait(keys, deadline).withContext("waiting for aggregator daemons"));
  std::vector<std::string> addresses;
  for (const auto& k : keys) {
    COFAB_ASSIGN_OR_RETURN(Bytes v, store.get(k, deadline));
    addresses.push_back(toString(v));
  }
  return addresses;
}

StatusOr<std::vector<std::string>> daemonAddresses(Store* store, const std::string& prefix,
                                                   const std::vector<std::string>& listed,
                                                   Deadline deadline, const std::string& who) {
  if (!listed.empty()) return listed;
  if (store == nullptr) return InvalidArgument(who + " without a store needs serverAddresses");
  return discoverDaemons(*store, prefix, deadline);
}

namespace {

Status checkChunkSize(Store& store, const std::string& prefix, size_t daemons, size_t chunkBytes,
                      Deadline deadline, const std::string& who, const std::string& what) {
  for (size_t i = 0; i < daemons; ++i) {
    const std::string key = serverMaxChunkKey(prefix, static_cast<int>(i));
    COFAB_ASSIGN_OR_RETURN(bool published, store.check({key}));
    if (!published) continue;
    COFAB_ASSIGN_OR_RETURN(Bytes v, store.get(key, deadline));
    COFAB_ASSIGN_OR_RETURN(int64_t limit, parseCounter(key, v));
    if (limit > 0 && chunkBytes > static_cast<uint64_t>(limit)) {
      return InvalidArgument(who + ": chunks of " + std::to_string(chunkBytes) + " bytes (" + what +
                             ") exceed aggregator " + std::to_string(i) + "'s --max-chunk-bytes " +
                             std::to_string(limit));
    }
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::vector<std::string>> findDaemons(Store* store, const std::string& prefix,
                                               const std::vector<std::string>& listed,
                                               size_t chunkBytes, Deadline deadline,
                                               const std::string& who,
                                               const std::string& chunkOption) {
  COFAB_ASSIGN_OR_RETURN(std::vector<std::string> addresses,
                         daemonAddresses(store, prefix, listed, deadline, who));
  if (store != nullptr && listed.empty()) {
    COFAB_RETURN_IF_ERROR(
        checkChunkSize(*store, prefix, addresses.size(), chunkBytes, deadline, who, chunkOption));
  }
  return addresses;
}

}  // namespace cofab::ps
