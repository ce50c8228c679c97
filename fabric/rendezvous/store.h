// Store: the key-value rendezvous that ranks, daemons and launchers meet through.
//
// Keys are strings (at most 4096 bytes), values are bytes (at most 64 MiB). Every call that can
// wait takes a Deadline; none blocks past it. Implementations are thread-safe: any thread may
// call any method concurrently. HashStore is in-process (threads as ranks), FileStore spans the
// processes of one host, TcpStore spans hosts; PrefixStore namespaces any of them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/clock.h"
#include "core/status.h"

namespace cofab {

using Bytes = std::vector<uint8_t>;

inline constexpr size_t kMaxStoreKeyBytes = 4096;
inline constexpr size_t kMaxStoreValueBytes = 64u << 20;

inline Bytes toBytes(std::string_view s) { return Bytes(s.begin(), s.end()); }
inline std::string toString(const Bytes& b) { return std::string(b.begin(), b.end()); }

class Store {
 public:
  virtual ~Store() = default;

  // Sets key to value, waking waiters. A network store may send it again after a lost
  // connection (at least once): with several writers of one key, use compareSet.
  virtual Status set(std::string_view key, const Bytes& value) = 0;
  // set() that gives up at `deadline` when that comes before the store's own call timeout: for
  // a caller that must answer by a deadline of its own (a collective's failure report) while the
  // store may be gone (tcp) or its lock held by a stopped process (files). Stores whose calls
  // never wait (memory) just set().
  virtual Status setBy(std::string_view key, const Bytes& value, Deadline deadline) {
    (void)deadline;
    return set(key, value);
  }
  // Returns the value once the key exists; DeadlineExceeded naming the key otherwise.
  virtual StatusOr<Bytes> get(std::string_view key, Deadline deadline) = 0;
  // Atomically adds delta to the integer stored at key (absent counts as 0) and returns the
  // result. The value is kept as decimal text, so get() on it reads e.g. "42". A sum that would
  // overflow int64 is InvalidArgument naming the key, and the value stays as it was.
  virtual StatusOr<int64_t> add(std::string_view key, int64_t delta) = 0;
  // Waits until every key exists; DeadlineExceeded naming the missing keys otherwise.
  virtual Status wait(const std::vector<std::string>& keys, Deadline deadline) = 0;
  // If the current value equals `expected` (an empty `expected` means "absent"), sets `desired`.
  // Returns the value after the call: `desired` when it was swapped in, else the current one.
  // `expected` and `desired` longer than kMaxStoreValueBytes are InvalidArgument.
  virtual StatusOr<Bytes> compareSet(std::string_view key, const Bytes& expected,
                                     const Bytes& desired) = 0;
  // Deletes key; returns whether it existed (false also when a network store's resend, after a
  // lost connection, finds the key its first sending removed).
  virtual StatusOr<bool> remove(std::string_view key) = 0;
  // Whether every key exists right now (no waiting).
  virtual StatusOr<bool> check(const std::vector<std::string>& keys) = 0;

  // Human-readable description for error messages: "tcp://host:port", "file:///dir", ...
  virtual std::string describe() const = 0;
};

// InvalidArgument for empty or overlong keys and overlong values; shared by every store.
Status validateStoreKey(std::string_view key);
Status validateStoreValue(const Bytes& value);
// COFAB_STORE_TIMEOUT_MS: the deadline of store calls that take none (set, add, ...).
StatusOr<int64_t> storeCallTimeoutMs();
// Parses the decimal text an add() keeps; InvalidArgument if the key holds something else.
StatusOr<int64_t> parseCounter(std::string_view key, const Bytes& value);
// What add(key, delta) stores: the counter in `current` (null: the key is absent, 0) plus delta.
// InvalidArgument, naming the key, when the value is not a counter or the sum leaves int64 (the
// stored value is then left as it was): every store's add() shares this rule.
StatusOr<int64_t> addToCounter(std::string_view key, const Bytes* current, int64_t delta);

// Creates a store from a URL: "tcp://host:port" (a TcpStore client), "file:///abs/dir"
// (a FileStore), "hash://" is rejected here (in-process only: construct HashStore directly).
StatusOr<std::unique_ptr<Store>> openStore(std::string_view url, Deadline connectDeadline);

}  // namespace cofab
