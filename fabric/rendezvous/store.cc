#include "fabric/rendezvous/store.h"

#include <cerrno>
#include <cstdlib>

#include "core/param.h"
#include "fabric/rendezvous/file_store.h"
#include "fabric/rendezvous/tcp_store.h"

namespace cofab {

COFAB_PARAM_INT(kStoreTimeoutMs, "COFAB_STORE_TIMEOUT_MS", 60000, 1, 86400000,
                "deadline in ms for store calls that take none (set, add, ...) incl. reconnects");

StatusOr<int64_t> storeCallTimeoutMs() { return kStoreTimeoutMs.get(); }

Status validateStoreKey(std::string_view key) {
  if (key.empty()) return InvalidArgument("store key is empty");
  if (key.size() > kMaxStoreKeyBytes) {
    return InvalidArgument("store key of " + std::to_string(key.size()) +
                           " bytes exceeds the limit of " + std::to_string(kMaxStoreKeyBytes));
  }
  return OkStatus();
}

Status validateStoreValue(const Bytes& value) {
  if (value.size() > kMaxStoreValueBytes) {
    return InvalidArgument("store value of " + std::to_string(value.size()) +
                           " bytes exceeds the limit of " + std::to_string(kMaxStoreValueBytes));
  }
  return OkStatus();
}

StatusOr<int64_t> parseCounter(std::string_view key, const Bytes& value) {
  if (value.empty()) return int64_t{0};
  std::string text(value.begin(), value.end());
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (*end != '\0' || errno == ERANGE) {
    return InvalidArgument("add() on key '" + std::string(key) +
                           "' whose value is not a decimal integer");
  }
  return static_cast<int64_t>(v);
}

StatusOr<int64_t> addToCounter(std::string_view key, const Bytes* current, int64_t delta) {
  int64_t cur = 0;
  if (current) {
    COFAB_ASSIGN_OR_RETURN(cur, parseCounter(key, *current));
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(cur, delta, &sum)) {
    return InvalidArgument("add(" + std::to_string(delta) + ") on key '" + std::string(key) +
                           "' holding " + std::to_string(cur) + " would overflow int64");
  }
  return sum;
}

StatusOr<std::unique_ptr<Store>> openStore(std::string_view url, Deadline connectDeadline) {
  constexpr std::string_view kTcp = "tcp://";
  constexpr std::string_view kFile = "file://";
  if (url.substr(0, kTcp.size()) == kTcp) {
    COFAB_ASSIGN_OR_RETURN(auto addr, parseHostPort(url.substr(kTcp.size())));
    COFAB_ASSIGN_OR_RETURN(
        auto client, TcpStore::connect(addr.host, addr.port, TcpStoreOptions{}, connectDeadline));
    return std::unique_ptr<Store>(std::move(client));
  }
  if (url.substr(0, kFile.size()) == kFile) {
    std::string dir(url.substr(kFile.size()));
    if (dir.empty() || dir[0] != '/') {
      return InvalidArgument("store URL '" + std::string(url) +
                             "': file:// needs an absolute directory, e.g. file:///tmp/job1");
    }
    COFAB_ASSIGN_OR_RETURN(auto store, FileStore::open(dir));
    return std::unique_ptr<Store>(std::move(store));
  }
  return InvalidArgument("store URL '" + std::string(url) +
                         "' not understood: expected tcp://host:port or file:///absolute/dir");
}

}  // namespace cofab
