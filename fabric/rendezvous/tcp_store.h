// TcpStore: the Store client for a TcpStoreServer (multi-host rendezvous).
//
// One request at a time per connection; calls from several threads each take a connection of
// their own (idle ones are kept, up to kIdleConnections), so a get() parked on the server for a
// key never holds up another thread's call, the set() of that key included. A lost connection
// is re-established with backoff until the call's deadline. Requests that cannot be applied
// twice (add, compareSet) are not resent once they may have reached the server: they fail with
// Unavailable saying the outcome is unknown.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "fabric/rendezvous/store.h"
#include "fabric/rendezvous/tcp_socket.h"
#include "fabric/rendezvous/tcp_store_protocol.h"

namespace cofab {

struct TcpStoreOptions {
  // Deadline for calls that do not take one (set, add, compareSet, remove, check), including
  // reconnection. 0: the COFAB_STORE_TIMEOUT_MS parameter.
  int64_t opTimeoutMs = 0;
};

class TcpStore final : public Store {
 public:
  // Connects (retrying until the deadline) and returns the client.
  static StatusOr<std::unique_ptr<TcpStore>> connect(const std::string& host, uint16_t port,
                                                     const TcpStoreOptions& options,
                                                     Deadline deadline);
  ~TcpStore() override;

  Status set(std::string_view key, const Bytes& value) override;
  Status setBy(std::string_view key, const Bytes& value, Deadline deadline) override;
  StatusOr<Bytes> get(std::string_view key, Deadline deadline) override;
  StatusOr<int64_t> add(std::string_view key, int64_t delta) override;
  Status wait(const std::vector<std::string>& keys, Deadline deadline) override;
  StatusOr<Bytes> compareSet(std::string_view key, const Bytes& expected,
                             const Bytes& desired) override;
  StatusOr<bool> remove(std::string_view key) override;
  StatusOr<bool> check(const std::vector<std::string>& keys) override;
  std::string describe() const override { return "tcp://" + addr_.toString(); }

 private:
  TcpStore(HostPort addr, int64_t opTimeoutMs) : addr_(std::move(addr)), opTimeoutMs_(opTimeoutMs) {}

  Deadline opDeadline() const { return Deadline::afterMs(opTimeoutMs_); }
  // Sends one request (`body`, framed here) and returns the response body (after the Reply byte
  // was checked: kOk bodies only; kTimeout and kError become Status). `idempotent` allows a
  // resend after a connection loss. `waitKeys`: the request is a get/wait for these keys; each
  // attempt then appends what remains of `deadline` as the server's wait, and a deadline that
  // passes on this side names the keys as the server's timeout reply would.
  StatusOr<Bytes> roundTrip(const store_proto::Writer& body, Deadline deadline, bool idempotent,
                            const std::vector<std::string>* waitKeys = nullptr);
  // One request on `*fd` (connected first when -1); the connection is left open on success.
  StatusOr<Bytes> exchangeOnce(int* fd, const Bytes& request, Deadline deadline, bool* sent);
  // An idle connection, or -1 (exchangeOnce connects); back to the idle set after a call.
  int takeConnection();
  void returnConnection(int fd);

  static constexpr size_t kIdleConnections = 4;
  HostPort addr_;
  int64_t opTimeoutMs_;
  std::mutex mu_;
  std::vector<int> idle_;  // under mu_
};

}  // namespace cofab
