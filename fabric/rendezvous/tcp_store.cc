#include "fabric/rendezvous/tcp_store.h"

#include <poll.h>
#include <unistd.h>

#include <thread>

#include "core/log.h"
#include "core/param.h"
#include "fabric/rendezvous/hash_store.h"
#include "fabric/rendezvous/tcp_store_protocol.h"

namespace cofab {

using store_proto::Op;
using store_proto::Reader;
using store_proto::Reply;
using store_proto::Writer;

namespace {
// How long past a waiting request's own deadline the client keeps listening for the server's
// timeout reply before treating the connection as lost.
constexpr int64_t kReplyGraceMs = 2000;
// Server-side wait timeouts travel as u32 milliseconds.
uint32_t waitMs(Deadline d) {
  if (d.isNever()) return UINT32_MAX;
  auto ms = d.remainingMsForPoll();
  return ms < 0 ? 0u : static_cast<uint32_t>(ms);
}
Deadline withGrace(Deadline d) {
  return d.isNever() ? d : Deadline::at(d.when() + std::chrono::milliseconds(kReplyGraceMs));
}
// A reply that breaks the protocol is the server's fault (or not a cofab store server at all):
// DataLoss, never the InvalidArgument of the shared decoder, which a caller would take for a
// mistake of its own.
Status malformedReply(const std::string& store, const std::string& why) {
  return DataLoss("malformed reply from store " + store + ": " + why +
                  " (is it a cofab store server of the same version?)");
}
// Reads a kOk reply's result fields with `read`; they must fill the body exactly.
template <typename T, typename Fn>
StatusOr<T> parseResult(const std::string& store, const Bytes& body, Fn read) {
  Reader r(body.data(), body.size());
  StatusOr<T> v = read(r);
  if (!v.ok()) return malformedReply(store, v.status().message());
  if (!r.done()) return malformedReply(store, "trailing bytes after the result");
  return v;
}
// A kOk reply to a request that returns nothing (set, wait) must be empty.
Status parseEmpty(const std::string& store, const StatusOr<Bytes>& body) {
  if (!body.ok()) return body.status();
  if (!body->empty()) return malformedReply(store, "trailing bytes after the result");
  return OkStatus();
}
// A wait or check request. Its key list must fit the protocol's body limit (65536 keys of
// 4 KiB each would not): the server would drop the connection as a protocol error and the
// client, the request being idempotent, would resend it until its deadline.
StatusOr<Writer> keyListRequest(Op op, const char* call, const std::vector<std::string>& keys) {
  if (keys.size() > store_proto::kMaxWaitKeys) {
    return InvalidArgument(std::string(call) + " on " + std::to_string(keys.size()) +
                           " keys; the limit is " + std::to_string(store_proto::kMaxWaitKeys));
  }
  Writer w;
  w.u8(static_cast<uint8_t>(op));
  w.u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) {
    COFAB_RETURN_IF_ERROR(validateStoreKey(k));
    w.str(k);
  }
  constexpr size_t kWaitMsField = 4;  // appended to each attempt of a wait
  if (w.size() + kWaitMsField > store_proto::kMaxBodyBytes) {
    return InvalidArgument(std::string(call) + " on " + std::to_string(keys.size()) +
                           " keys takes " + std::to_string(w.size()) +
                           " bytes, over the store protocol's limit of " +
                           std::to_string(store_proto::kMaxBodyBytes) +
                           ": use fewer or shorter keys");
  }
  return w;
}
}  // namespace

StatusOr<std::unique_ptr<TcpStore>> TcpStore::connect(const std::string& host, uint16_t port,
                                                      const TcpStoreOptions& options,
                                                      Deadline deadline) {
  int64_t timeout = options.opTimeoutMs;
  if (timeout < 0) return InvalidArgument("TcpStoreOptions.opTimeoutMs must be >= 0");
  if (timeout == 0) {
    COFAB_ASSIGN_OR_RETURN(timeout, storeCallTimeoutMs());
  }
  std::unique_ptr<TcpStore> store(new TcpStore(HostPort{host, port}, timeout));
  COFAB_ASSIGN_OR_RETURN(int fd, connectTcp(store->addr_, deadline));
  store->idle_.push_back(fd);
  return store;
}

TcpStore::~TcpStore() {
  for (int fd : idle_) ::close(fd);
}

// An idle connection sits at a message boundary, so anything readable on it (end of stream, a
// reset, stray bytes) means the server dropped it: a restarted store, an idle timeout on a
// middlebox. Such a connection is closed here, before a request goes out on it; sent on it, a
// non-idempotent request (add, compareSet) would fail as "may or may not have been applied"
// although no server ever saw it.
namespace {
bool idleConnectionIsLive(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  return ::poll(&p, 1, 0) == 0;
}
}  // namespace

int TcpStore::takeConnection() {
  std::lock_guard<std::mutex> lock(mu_);
  while (!idle_.empty()) {
    const int fd = idle_.back();
    idle_.pop_back();
    if (idleConnectionIsLive(fd)) return fd;
    ::close(fd);
  }
  return -1;
}

void TcpStore::returnConnection(int fd) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (idle_.size() < kIdleConnections) {
      idle_.push_back(fd);
      return;
    }
  }
  ::close(fd);
}

StatusOr<Bytes> TcpStore::exchangeOnce(int* fd, const Bytes& request, Deadline deadline,
                                       bool* sent) {
  std::string peer = "store " + describe();
  if (*fd < 0) {
    COFAB_ASSIGN_OR_RETURN(*fd, connectTcp(addr_, deadline));
  }
  *sent = true;  // from here on the server may have seen (part of) the request
  COFAB_RETURN_IF_ERROR(sendAll(*fd, request.data(), request.size(), deadline, peer));
  Deadline replyDeadline = withGrace(deadline);
  uint8_t header[store_proto::kFrameHeaderBytes];
  COFAB_RETURN_IF_ERROR(recvAll(*fd, header, sizeof(header), replyDeadline, peer));
  // Checked before anything is allocated: a length over the protocol's limit is not read.
  auto len = store_proto::parseFrameHeader(header, store_proto::kResponseMagic);
  if (!len.ok()) return malformedReply(describe(), len.status().message());
  Bytes body(*len);
  COFAB_RETURN_IF_ERROR(recvAll(*fd, body.data(), body.size(), replyDeadline, peer));
  return body;
}

StatusOr<Bytes> TcpStore::roundTrip(const Writer& request, Deadline deadline, bool idempotent,
                                    const std::vector<std::string>* waitKeys) {
  // This call's connection, not shared while the call runs: another thread's call takes another.
  int fd = takeConnection();
  auto backoff = std::chrono::milliseconds(10);
  while (true) {
    // Framed per attempt: a resent get/wait must ask the server to wait only for what is left
    // of the caller's deadline. The original timeout would keep the server waiting past it,
    // and the caller would see a socket timeout instead of the reply naming the missing keys.
    Bytes frame;
    if (waitKeys != nullptr) {
      Writer w = request;
      w.u32(waitMs(deadline));
      frame = w.frame(store_proto::kRequestMagic);
    } else {
      frame = request.frame(store_proto::kRequestMagic);
    }
    bool sent = false;
    auto body = exchangeOnce(&fd, frame, deadline, &sent);
    if (body.ok()) {
      returnConnection(fd);  // a whole reply was read: the stream is at a message boundary
      Reader r(body->data(), body->size());
      auto reply = r.u8();
      if (!reply.ok()) return malformedReply(describe(), "no status byte");
      switch (static_cast<Reply>(*reply)) {
        case Reply::kOk:
          return Bytes(body->begin() + 1, body->end());
        case Reply::kTimeout: {
          // Only a get or wait times out, and its key list fills the reply exactly.
          if (waitKeys == nullptr) return malformedReply(describe(), "a timeout to a request that cannot time out");
          std::vector<std::string> missing;
          auto n = r.u32();
          if (!n.ok()) return malformedReply(describe(), "timeout reply without its key count");
          for (uint32_t i = 0; i < *n; ++i) {
            auto k = r.str();
            if (!k.ok()) return malformedReply(describe(), "timeout reply's key list is cut short");
            missing.push_back(*k);
          }
          if (!r.done()) return malformedReply(describe(), "trailing bytes after the timeout reply");
          return storeWaitTimeout(describe(), missing);
        }
        case Reply::kError: {
          auto code = r.u8();
          auto msg = r.str();
          if (!code.ok() || !msg.ok() || *code == 0 ||
              *code > static_cast<uint8_t>(StatusCode::kInternal) || !r.done()) {
            return malformedReply(describe(), "error reply with an unknown code or a bad layout");
          }
          return Status(static_cast<StatusCode>(*code), "store " + describe() + ": " + *msg);
        }
      }
      return malformedReply(describe(), "unknown reply status " + std::to_string(*reply));
    }
    if (fd >= 0) ::close(fd);  // the stream may be mid-message: never reused
    fd = -1;
    const Status& err = body.status();
    // A malformed frame is not a lost connection: the server would answer a resend the same
    // way, so say so now rather than retry until the deadline.
    if (err.code() == StatusCode::kDataLoss) return err;
    if (sent && !idempotent) {
      return Unavailable("lost the connection to store " + describe() +
                         " after sending a non-idempotent request; it may or may not have been "
                         "applied (" +
                         err.message() + ")");
    }
    if (deadline.expired() && waitKeys != nullptr) {
      // No answer from the server in time: from here the keys are missing all the same.
      return DeadlineExceeded(storeWaitTimeout(describe(), *waitKeys).message() +
                              " (no answer from the server: " + err.message() + ")");
    }
    if (deadline.expired()) {
      return err.code() == StatusCode::kDeadlineExceeded
                 ? err
                 : DeadlineExceeded("store " + describe() +
                                    " unreachable before the deadline: " + err.message());
    }
    COFAB_LOG(kInfo, "store") << "retrying store request after: " << err.message();
    std::this_thread::sleep_for(std::min<Duration>(backoff, deadline.remaining()));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
}

Status TcpStore::set(std::string_view key, const Bytes& value) {
  return setBy(key, value, Deadline::never());
}

Status TcpStore::setBy(std::string_view key, const Bytes& value, Deadline deadline) {
  COFAB_RETURN_IF_ERROR(validateStoreKey(key));
  COFAB_RETURN_IF_ERROR(validateStoreValue(value));
  Writer w;
  w.u8(static_cast<uint8_t>(Op::kSet));
  w.str(key);
  w.blob(value);
  return parseEmpty(describe(), roundTrip(w, opDeadline().min(deadline), true));
}

StatusOr<Bytes> TcpStore::get(std::string_view key, Deadline deadline) {
  COFAB_RETURN_IF_ERROR(validateStoreKey(key));
  Writer w;
  w.u8(static_cast<uint8_t>(Op::kGet));
  w.str(key);
  const std::vector<std::string> keys{std::string(key)};
  COFAB_ASSIGN_OR_RETURN(Bytes body, roundTrip(w, deadline, true, &keys));
  return parseResult<Bytes>(describe(), body, [](Reader& r) { return r.blob(); });
}

StatusOr<int64_t> TcpStore::add(std::string_view key, int64_t delta) {
  COFAB_RETURN_IF_ERROR(validateStoreKey(key));
  Writer w;
  w.u8(static_cast<uint8_t>(Op::kAdd));
  w.str(key);
  w.i64(delta);
  COFAB_ASSIGN_OR_RETURN(Bytes body, roundTrip(w, opDeadline(), false));
  return parseResult<int64_t>(describe(), body, [](Reader& r) { return r.i64(); });
}

Status TcpStore::wait(const std::vector<std::string>& keys, Deadline deadline) {
  COFAB_ASSIGN_OR_RETURN(Writer w, keyListRequest(Op::kWait, "wait()", keys));
  return parseEmpty(describe(), roundTrip(w, deadline, true, &keys));
}

StatusOr<Bytes> TcpStore::compareSet(std::string_view key, const Bytes& expected,
                                     const Bytes& desired) {
  COFAB_RETURN_IF_ERROR(validateStoreKey(key));
  COFAB_RETURN_IF_ERROR(validateStoreValue(expected));
  COFAB_RETURN_IF_ERROR(validateStoreValue(desired));
  Writer w;
  w.u8(static_cast<uint8_t>(Op::kCompareSet));
  w.str(key);
  w.blob(expected);
  w.blob(desired);
  COFAB_ASSIGN_OR_RETURN(Bytes body, roundTrip(w, opDeadline(), false));
  return parseResult<Bytes>(describe(), body, [](Reader& r) { return r.blob(); });
}

StatusOr<bool> TcpStore::remove(std::string_view key) {
  COFAB_RETURN_IF_ERROR(validateStoreKey(key));
  Writer w;
  w.u8(static_cast<uint8_t>(Op::kRemove));
  w.str(key);
  COFAB_ASSIGN_OR_RETURN(Bytes body, roundTrip(w, opDeadline(), true));
  COFAB_ASSIGN_OR_RETURN(uint8_t existed,
                         parseResult<uint8_t>(describe(), body, [](Reader& r) { return r.u8(); }));
  return existed != 0;
}

StatusOr<bool> TcpStore::check(const std::vector<std::string>& keys) {
  COFAB_ASSIGN_OR_RETURN(Writer w, keyListRequest(Op::kCheck, "check()", keys));
  COFAB_ASSIGN_OR_RETURN(Bytes body, roundTrip(w, opDeadline(), true));
  COFAB_ASSIGN_OR_RETURN(uint8_t all,
                         parseResult<uint8_t>(describe(), body, [](Reader& r) { return r.u8(); }));
  return all != 0;
}

}  // namespace cofab
