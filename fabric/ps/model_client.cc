// ModelClient implementation. One mutex (mu_) guards the table of requests in flight (by the
// header's sequence number, which the daemon echoes) and the daemon states; it is held to look
// up or update an entry, never across a wait. Answers are copied into the caller's tensor on the
// transport's I/O thread under mu_, and a call that gives up (deadline) removes its requests
// under mu_ first, so nothing is written to the caller's memory after the call returned.
#include "fabric/ps/model_client.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "core/param.h"
#include "fabric/ps/daemon_directory.h"
#include "fabric/ps/placement.h"
#include "fabric/ps/ps_protocol.h"
#include "fabric/transport/registry.h"

namespace cofab::ps {

// Bounded by kMaxModelChunkBytes (ps_protocol.h): the largest message this client receives is
// a ModelAppliedValue answer, the reply record and then one chunk.
COFAB_PARAM_INT(kPsModelChunkBytes, "COFAB_PS_MODEL_CHUNK_BYTES", 4 << 20, 64,
                static_cast<int64_t>(kMaxModelChunkBytes),
                "model store chunk size in bytes (same on every worker; at most 1 GiB - 24: "
                "an apply-pull answer carries 24 bytes besides the chunk)");

namespace {

// The version of a chunk this client never received (a pull that failed partway): no base for
// an apply-pull. A real version is a count of updates and never reaches it.
constexpr uint64_t kUnknownVersion = ~0ull;

// The answer kinds a request accepts (a kReject is accepted by every request).
bool answers(ControlOp request, ControlOp answer) {
  switch (request) {
    case ControlOp::kModelInit:
      return answer == ControlOp::kModelAck;
    case ControlOp::kModelPull:
    case ControlOp::kModelElastic:
      return answer == ControlOp::kModelValue;
    case ControlOp::kModelApply:
      return answer == ControlOp::kModelApplied || answer == ControlOp::kModelDeferred;
    case ControlOp::kModelApplyPull:
      return answer == ControlOp::kModelAppliedValue;
    default:
      return false;
  }
}

// The header dtype of each answer kind: ModelValue carries the chunk's f32 elements, every other
// answer bytes (a record, text).
DType answerDType(ControlOp answer) {
  return answer == ControlOp::kModelValue ? DType::kF32 : DType::kU8;
}

struct Call {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
  std::string what;  // "apply key=7 clock=3"
  uint32_t remaining = 0;
  std::vector<int> chunkServer;  // -1 once answered
  std::vector<uint64_t> seqs;    // this call's requests (guarded by the client's mu_)
  uint64_t minVersion = ~0ull;
  uint64_t maxStaleness = 0;
  bool dropped = false;
  uint32_t droppedChunks = 0;
  std::string dropText;
  std::string deferredText;

  // One chunk's apply outcome (both answer kinds). `why` is called only for the first drop.
  template <typename Why>
  void noteOutcome(uint64_t staleness, bool wasDropped, Why&& why) {
    std::lock_guard<std::mutex> l(mu);
    maxStaleness = std::max(maxStaleness, staleness);
    if (!wasDropped) return;
    dropped = true;
    droppedChunks++;
    if (dropText.empty()) dropText = why();
  }

  void finish(Status s) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (done) return;
      done = true;
      status = std::move(s);
    }
    cv.notify_all();
  }
};

struct Request {
  std::shared_ptr<Call> call;
  ControlOp op = ControlOp::kModelPull;  // what was asked: decides the answers accepted
  uint64_t key = 0;
  uint32_t chunk = 0;
  int server = 0;
  float* out = nullptr;  // pull / elastic / apply-pull: where the chunk's answer goes
  size_t count = 0;
  uint32_t chunkCount = 0;
  bool recordVersion = false;  // pull / apply-pull: the answer's version is the chunk's new base
};

struct Server {
  std::string address;
  std::shared_ptr<transport::Connection> conn;
  bool dead = false;
  std::string why;
};

}  // namespace

class ModelClient::Impl {
 public:
  Impl(int rank, ClientOptions options) : rank_(rank), options_(std::move(options)) {}
  ~Impl() { close(); }

  Status start(const std::vector<std::string>& addresses, Deadline deadline) {
    transport::ContextOptions co;
    co.localId = workerPeerId(rank_);
    COFAB_ASSIGN_OR_RETURN(ctx_, transport::Registry::create(options_.transport, co));
    servers_.resize(addresses.size());
    for (size_t s = 0; s < addresses.size(); ++s) {
      transport::ConnectOptions opts;
      opts.localId = workerPeerId(rank_);
      auto conn = ctx_->connect(addresses[s], opts, deadline);
      if (!conn.ok()) {
        return conn.status().withContext("model client of worker " + std::to_string(rank_) +
                                         " connecting to aggregator " + std::to_string(s));
      }
      servers_[s].address = addresses[s];
      servers_[s].conn = std::move(conn).value();
    }
    for (size_t s = 0; s < servers_.size(); ++s) postRecv(static_cast<int>(s), servers_[s].conn);
    return OkStatus();
  }

  // One tensor of a request: `payload` is the tensor sent (init/apply/elastic/apply-pull; null
  // for pull), `out` where answers go (pull/elastic/apply-pull; else null).
  struct Spec {
    uint64_t key = 0;
    size_t count = 0;
    const float* payload = nullptr;
    float* out = nullptr;
    uint64_t iteration = 0;
    std::string what;
  };

  // Sends one request per chunk of `key`.
  std::shared_ptr<Call> begin(ControlOp op, uint64_t key, size_t count, const float* payload,
                              float* out, uint64_t iteration, std::string what) {
    std::vector<Spec> specs(1);
    specs[0] = Spec{key, count, payload, out, iteration, std::move(what)};
    return beginAll(op, specs).front();
  }

  // One call per spec. Nothing is sent unless every spec can be (client open; for apply-pull a
  // base version known for every chunk; every chunk's daemon alive): otherwise every call fails
  // with the first reason, so a refused applyAndPull has applied none of its updates.
  std::vector<std::shared_ptr<Call>> beginAll(ControlOp op, const std::vector<Spec>& specs) {
    std::vector<std::shared_ptr<Call>> calls;
    std::vector<ChunkLayout> layouts;
    calls.reserve(specs.size());
    layouts.reserve(specs.size());
    for (const Spec& sp : specs) {
      auto call = std::make_shared<Call>();
      call->what = sp.what;
      const ChunkLayout layout = chunkLayout(sp.count, sizeof(float), chunkBytes_);
      call->remaining = layout.chunkCount;
      call->chunkServer.assign(layout.chunkCount, -1);
      calls.push_back(std::move(call));
      layouts.push_back(layout);
    }
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::vector<uint64_t>> bases(specs.size());
    Status refused;
    for (size_t i = 0; i < specs.size() && refused.ok(); ++i) {
      refused = checkLocked(op, specs[i], layouts[i], &bases[i]);
    }
    if (!refused.ok()) {
      for (auto& call : calls) call->finish(refused);
      return calls;
    }
    for (size_t i = 0; i < specs.size(); ++i) {
      sendLocked(op, specs[i], layouts[i], calls[i], bases[i]);
    }
    return calls;
  }

  Status wait(const std::shared_ptr<Call>& call, Deadline deadline) {
    {
      std::unique_lock<std::mutex> lock(call->mu);
      call->cv.wait_until(lock, deadline.when(), [&] { return call->done; });
      if (call->done) return call->status;
    }
    // Give up: withdraw the requests first so no late answer touches the caller's memory.
    std::lock_guard<std::mutex> lock(mu_);
    std::lock_guard<std::mutex> l(call->mu);
    if (call->done) return call->status;
    for (uint64_t seq : call->seqs) pending_.erase(seq);
    std::ostringstream os;
    os << call->what << ": " << call->remaining << " of " << call->chunkServer.size()
       << " chunks unanswered:";
    int shown = 0;
    for (size_t c = 0; c < call->chunkServer.size() && shown < 8; ++c) {
      if (call->chunkServer[c] < 0) continue;
      os << " chunk " << c << " (" << serverName(call->chunkServer[c]) << ")";
      ++shown;
    }
    if (!call->deferredText.empty()) {
      os << "; held by the staleness bound: " << call->deferredText
         << " (the daemon keeps the update and applies it once released)";
    }
    call->done = true;
    call->status = DeadlineExceeded(os.str());
    return call->status;
  }

  void leave() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!closed_) sendLeaveLocked();
  }

  void close() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return;
      closed_ = true;
    }
    if (!ctx_) return;
    // Leave the model store (the others stop waiting for this worker), then say goodbye so the
    // daemons do not count this orderly exit as a dead worker.
    std::vector<std::shared_ptr<std::atomic<bool>>> sent;
    {
      std::lock_guard<std::mutex> lock(mu_);
      sendLeaveLocked();
      for (auto& s : servers_) {
        if (s.dead || !s.conn) continue;
        wire::Header bye;
        bye.type = wire::MessageType::kGoodbye;
        bye.senderRank = static_cast<uint32_t>(rank_);
        auto flag = std::make_shared<std::atomic<bool>>(false);
        s.conn->send(bye, nullptr, 0, [flag](const Status&) { flag->store(true); });
        sent.push_back(flag);
      }
    }
    const Deadline d = Deadline::afterMs(1000);
    for (auto& f : sent) {
      while (!f->load() && !d.expired()) std::this_thread::sleep_for(Millis(1));
    }
    ctx_->close();
    ctx_->join();
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [seq, r] : pending_) r.call->finish(Cancelled(r.call->what + ": client closed"));
    pending_.clear();
  }

  int rank_;
  ClientOptions options_;
  size_t chunkBytes_ = 4 << 20;
  std::vector<Server> servers_;
  std::atomic<uint64_t> bytesOut_{0}, bytesIn_{0}, requests_{0};

 private:
  std::string serverName(int s) const {
    return "aggregator " + std::to_string(s) + " (" + servers_[static_cast<size_t>(s)].address +
           ")";
  }

  void postRecv(int server, std::shared_ptr<transport::Connection> conn) {
    conn->recvOwned([this, server, conn](const Status& st, const wire::Header& h,
                                         std::vector<uint8_t>&& payload) {
      if (!st.ok()) {
        onServerError(server, conn, st);
        return;
      }
      onMessage(server, h, std::move(payload));
      postRecv(server, conn);
    });
  }

  // kModelLeave to every daemon still there (fire and forget: the connection keeps the order).
  void sendLeaveLocked() {
    for (auto& s : servers_) {
      if (s.dead || !s.conn) continue;
      wire::Header leave;
      leave.type = wire::MessageType::kControl;
      leave.opcode = static_cast<uint8_t>(ControlOp::kModelLeave);
      leave.senderRank = static_cast<uint32_t>(rank_);
      s.conn->send(leave, nullptr, 0, [](const Status&) {});
    }
  }

  // Whether `sp` can be sent now; for apply-pull its chunks' base versions go to *bases.
  Status checkLocked(ControlOp op, const Spec& sp, const ChunkLayout& layout,
                     std::vector<uint64_t>* bases) {
    if (closed_) return Cancelled(sp.what + ": the model client is closed");
    if (op == ControlOp::kModelApplyPull) {
      auto it = versions_.find(sp.key);
      if (it == versions_.end() || it->second.size() != layout.chunkCount) {
        return FailedPrecondition(sp.what +
                                  ": no model version known for this key and size on this "
                                  "client (pull it first)");
      }
      for (uint32_t c = 0; c < layout.chunkCount; ++c) {
        if (it->second[c] == kUnknownVersion) {
          return FailedPrecondition(sp.what + ": chunk " + std::to_string(c) + " of " +
                                    std::to_string(layout.chunkCount) +
                                    " was never received by this client (a pull that failed "
                                    "partway?), so it has no base version (pull it first)");
        }
      }
      *bases = it->second;
    }
    const int m = static_cast<int>(servers_.size());
    for (uint32_t c = 0; c < layout.chunkCount; ++c) {
      const int server = primaryServer(sp.key, c, m);
      const Server& s = servers_[static_cast<size_t>(server)];
      if (s.dead) {
        return Unavailable(sp.what + ": " + serverName(server) + " is gone (" + s.why +
                           "); the model store has no replication");
      }
    }
    return OkStatus();
  }

  // Sends one request per chunk of `sp` (checked by checkLocked).
  void sendLocked(ControlOp op, const Spec& sp, const ChunkLayout& layout,
                  const std::shared_ptr<Call>& call, const std::vector<uint64_t>& bases) {
    const int m = static_cast<int>(servers_.size());
    for (uint32_t c = 0; c < layout.chunkCount; ++c) {
      const int server = primaryServer(sp.key, c, m);
      Server& s = servers_[static_cast<size_t>(server)];
      const size_t first = static_cast<size_t>(c) * layout.elementsPerChunk;
      const size_t n = std::min(layout.elementsPerChunk, sp.count - first);
      const uint64_t seq = nextSeq_++;
      Request r;
      r.call = call;
      r.op = op;
      r.key = sp.key;
      r.chunk = c;
      r.server = server;
      r.out = sp.out ? sp.out + first : nullptr;
      r.count = n;
      r.chunkCount = layout.chunkCount;
      r.recordVersion = op == ControlOp::kModelPull || op == ControlOp::kModelApplyPull;
      pending_.emplace(seq, r);
      call->seqs.push_back(seq);
      {
        std::lock_guard<std::mutex> l(call->mu);
        call->chunkServer[c] = server;
      }
      wire::Header h;
      h.type = wire::MessageType::kControl;
      h.opcode = static_cast<uint8_t>(op);
      h.senderRank = static_cast<uint32_t>(rank_);
      h.key = sp.key;
      h.chunkIndex = c;
      h.chunkCount = layout.chunkCount;
      h.dtype = DType::kF32;
      h.iteration = op == ControlOp::kModelApplyPull ? bases[c] : sp.iteration;
      h.sequence = seq;
      auto conn = s.conn;
      auto onSent = [this, server, conn](const Status& st) {
        if (!st.ok()) onServerError(server, conn, st);
      };
      if (sp.payload) {
        // A copy: the caller's tensor is only lent for the call, which may end first (deadline).
        // Built from the range: no zero-fill of a buffer that is overwritten at once.
        const auto* src = reinterpret_cast<const uint8_t*>(sp.payload + first);
        auto buf = std::make_shared<std::vector<uint8_t>>(src, src + n * sizeof(float));
        bytesOut_.fetch_add(buf->size(), std::memory_order_relaxed);
        const uint8_t* data = buf->data();
        const size_t size = buf->size();
        conn->send(h, data, size, [buf, onSent](const Status& st) { onSent(st); });
      } else {
        conn->send(h, nullptr, 0, onSent);
      }
    }
    if (layout.chunkCount == 0) call->finish(OkStatus());
  }

  // Chunks of the key not received yet are marked unknown: no apply-pull base until pulled.
  void recordVersionLocked(const Request& r, uint64_t version) {
    std::vector<uint64_t>& v = versions_[r.key];
    if (v.size() != r.chunkCount) v.assign(r.chunkCount, kUnknownVersion);
    v[r.chunk] = version;
  }

  // Fails `call` and withdraws its other requests.
  void failLocked(std::shared_ptr<Call> call, Status st) {  // by value: may erase its owner
    for (uint64_t seq : call->seqs) pending_.erase(seq);
    call->finish(std::move(st));
  }

  void chunkDoneLocked(uint64_t seq, Request& r, uint64_t version) {
    auto call = r.call;
    const uint32_t chunk = r.chunk;
    pending_.erase(seq);
    bool complete = false;
    {
      std::lock_guard<std::mutex> l(call->mu);
      call->chunkServer[chunk] = -1;
      call->minVersion = std::min(call->minVersion, version);
      complete = --call->remaining == 0;
    }
    if (complete) call->finish(OkStatus());
  }

  void onMessage(int server, const wire::Header& h, std::vector<uint8_t>&& payload) {
    if (h.type != wire::MessageType::kControl) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(h.sequence);
    if (it == pending_.end()) return;  // the call gave up (deadline) or failed
    Request& r = it->second;
    const std::string chunkName =
        r.call->what + " chunk " + std::to_string(r.chunk) + " on " + serverName(server);
    if (r.server != server || r.key != h.key || r.chunk != h.chunkIndex ||
        r.chunkCount != h.chunkCount) {
      failLocked(r.call, DataLoss(chunkName + ": answer for another request: " + h.describe()));
      return;
    }
    const auto kind = static_cast<ControlOp>(h.opcode);
    if (kind != ControlOp::kReject) {
      // A wrong kind would complete the request without its answer (a pull whose `out` was
      // never written finishing OK); a wrong dtype means the payload is not what we read.
      if (!answers(r.op, kind)) {
        failLocked(r.call, DataLoss(chunkName + ": answer of the wrong kind (opcode " +
                                    std::to_string(h.opcode) + ") to a request of opcode " +
                                    std::to_string(static_cast<int>(r.op)) + ": " + h.describe()));
        return;
      }
      if (h.dtype != answerDType(kind)) {
        failLocked(r.call,
                   DataLoss(chunkName + ": answer with dtype " + std::string(dtypeName(h.dtype)) +
                            ", expected " + std::string(dtypeName(answerDType(kind))) + ": " +
                            h.describe()));
        return;
      }
    }
    bytesIn_.fetch_add(payload.size(), std::memory_order_relaxed);
    switch (kind) {
      case ControlOp::kModelAck:
        chunkDoneLocked(h.sequence, r, h.iteration);
        return;
      case ControlOp::kModelValue:
        if (r.out == nullptr) {
          failLocked(r.call, DataLoss(chunkName + ": a value answer to a request for none"));
          return;
        }
        if (payload.size() != r.count * sizeof(float)) {
          // A pull carries no size: a value of another size is the key's, and the caller's
          // tensor is the wrong one (the chunk layout agreed, or the answer would not match).
          failLocked(r.call,
                     InvalidArgument(chunkName + " holds " +
                                     std::to_string(payload.size() / sizeof(float)) +
                                     " floats, the tensor has " + std::to_string(r.count) +
                                     " for it: pull with the size the key was initialized with"));
          return;
        }
        std::memcpy(r.out, payload.data(), payload.size());
        if (r.recordVersion) recordVersionLocked(r, h.iteration);
        chunkDoneLocked(h.sequence, r, h.iteration);
        return;
      case ControlOp::kModelApplied: {
        if (payload.size() < kModelApplyReplyBytes) {
          failLocked(r.call, DataLoss(chunkName + ": short apply answer"));
          return;
        }
        uint64_t version = 0, staleness = 0;
        std::memcpy(&version, payload.data() + 8, 8);
        std::memcpy(&staleness, payload.data() + 16, 8);
        r.call->noteOutcome(staleness, payload[0] != 0, [&] {
          return std::string(payload.begin() + kModelApplyReplyBytes, payload.end());
        });
        chunkDoneLocked(h.sequence, r, version);
        return;
      }
      case ControlOp::kModelAppliedValue: {
        if (r.out == nullptr || payload.size() != kModelApplyReplyBytes + r.count * sizeof(float)) {
          failLocked(r.call,
                     DataLoss(chunkName + " sent an apply-pull answer of " +
                              std::to_string(payload.size()) + " bytes, expected " +
                              std::to_string(kModelApplyReplyBytes + r.count * sizeof(float))));
          return;
        }
        uint32_t bound = 0;
        uint64_t version = 0, staleness = 0;
        std::memcpy(&bound, payload.data() + 4, 4);
        std::memcpy(&version, payload.data() + 8, 8);
        std::memcpy(&staleness, payload.data() + 16, 8);
        std::memcpy(r.out, payload.data() + kModelApplyReplyBytes, r.count * sizeof(float));
        recordVersionLocked(r, version);
        r.call->noteOutcome(staleness, payload[0] != 0, [&] {
          return chunkName + " dropped: " + std::to_string(staleness) +
                 " updates were applied since its version " + std::to_string(version - staleness) +
                 " was read, more than the bound " + std::to_string(bound) +
                 " (the answer carries the current value)";
        });
        chunkDoneLocked(h.sequence, r, version);
        return;
      }
      case ControlOp::kModelDeferred: {
        std::lock_guard<std::mutex> l(r.call->mu);
        r.call->deferredText =
            serverName(server) + ": " + std::string(payload.begin(), payload.end());
        return;
      }
      case ControlOp::kReject: {
        const Reject rej = parseReject(payload);
        std::string msg = chunkName + " rejected: " + rej.describe();
        const bool precondition =
            rej.reason == RejectReason::kUninitialized || rej.reason == RejectReason::kDraining;
        failLocked(r.call, precondition ? FailedPrecondition(msg) : InvalidArgument(msg));
        return;
      }
      default:  // answers() accepted none other
        return;
    }
  }

  void onServerError(int server, const std::shared_ptr<transport::Connection>& conn,
                     const Status& st) {
    std::lock_guard<std::mutex> lock(mu_);
    Server& s = servers_[static_cast<size_t>(server)];
    if (closed_ || s.dead || s.conn != conn) return;
    s.dead = true;
    s.why = st.toString();
    s.conn->close();
    std::vector<std::shared_ptr<Call>> failed;
    for (auto& [seq, r] : pending_) {
      if (r.server == server) failed.push_back(r.call);
    }
    for (auto& call : failed) {
      failLocked(call, Unavailable(call->what + ": " + serverName(server) + " failed (" + s.why +
                                   "); the model store has no replication"));
    }
  }

  std::mutex mu_;
  bool closed_ = false;
  uint64_t nextSeq_ = 1;
  std::shared_ptr<transport::Context> ctx_;
  std::unordered_map<uint64_t, Request> pending_;
  // Per key, per chunk: the version of the value this client last received (apply-pull's base).
  std::unordered_map<uint64_t, std::vector<uint64_t>> versions_;
};

namespace {

Status checkF32(const TensorView& t, const char* what) {
  COFAB_RETURN_IF_ERROR(t.validate(what));
  if (!t.device.isCpu()) return InvalidArgument(std::string(what) + ": host tensors only");
  if (t.dtype != DType::kF32) {
    return InvalidArgument(std::string(what) + ": the model store holds f32, got " +
                           std::string(dtypeName(t.dtype)));
  }
  if (t.count == 0) return InvalidArgument(std::string(what) + ": empty tensor");
  return OkStatus();
}

ApplyResult resultOf(const Call& call) {  // call.mu held
  ApplyResult r;
  r.outcome = call.dropped ? ApplyOutcome::kDropped : ApplyOutcome::kApplied;
  r.version = call.minVersion;
  r.staleness = call.maxStaleness;
  r.chunks = static_cast<uint32_t>(call.chunkServer.size());
  r.droppedChunks = call.droppedChunks;
  r.dropReason = call.dropText;
  return r;
}

std::string name(const char* op, uint64_t key) {
  return std::string("model ") + op + " key=" + std::to_string(key);
}

StatusOr<std::unique_ptr<ModelClient::Impl>> makeImpl(int rank, int worldSize,
                                                      ClientOptions options) {
  if (worldSize <= 0 || rank < 0 || rank >= worldSize) {
    return InvalidArgument("ModelClient: rank " + std::to_string(rank) +
                           " outside a world of size " + std::to_string(worldSize));
  }
  if (options.transport.empty()) {
    // COFAB_PS_TRANSPORT is declared with PushPullClient (push_pull_client.cc); same meaning.
    if (!rawParamValue("COFAB_PS_TRANSPORT", &options.transport) || options.transport.empty()) {
      options.transport = "tcp";
    }
  }
  auto impl = std::make_unique<ModelClient::Impl>(rank, options);
  if (options.chunkBytes == 0) {
    StatusOr<int64_t> v = kPsModelChunkBytes.get();
    if (!v.ok()) {
      return v.status().withContext(
          "ModelClient: the model store's chunk size (an apply-pull answer carries 24 bytes "
          "besides the chunk, within a message's 1 GiB)");
    }
    impl->chunkBytes_ = static_cast<size_t>(*v);
  } else if (options.chunkBytes > kMaxModelChunkBytes) {
    return InvalidArgument(
        "ModelClient: ClientOptions::chunkBytes=" + std::to_string(options.chunkBytes) +
        " exceeds " + std::to_string(kMaxModelChunkBytes) +
        " (an apply-pull answer carries 24 bytes besides the chunk, within a "
        "message's 1 GiB)");
  } else {
    impl->chunkBytes_ = options.chunkBytes;
  }
  return impl;
}

// Validates the options, then finds the daemons (listed, or through `store`) and connects.
StatusOr<std::unique_ptr<ModelClient::Impl>> startImpl(Store* store, int rank, int worldSize,
                                                       const ClientOptions& options) {
  COFAB_ASSIGN_OR_RETURN(auto impl, makeImpl(rank, worldSize, options));
  // One deadline for all of connect (finding the daemons, checking their chunk limit, dialling
  // them), as PushPullClient::connect.
  const Deadline deadline = Deadline::afterMs(options.connectTimeoutMs);
  // Init and apply frames carry a chunk: one above a daemon's limit dropped the connection, and
  // the model store (no replication) then had that daemon dead for good.
  COFAB_ASSIGN_OR_RETURN(std::vector<std::string> addresses,
                         findDaemons(store, options.storePrefix, options.serverAddresses,
                                     impl->chunkBytes_, deadline, "ModelClient::connect",
                                     "ClientOptions::chunkBytes / COFAB_PS_MODEL_CHUNK_BYTES"));
  COFAB_RETURN_IF_ERROR(impl->start(addresses, deadline));
  return impl;
}

}  // namespace

StatusOr<std::unique_ptr<ModelClient>> ModelClient::connect(Store& store, int rank, int worldSize,
                                                            const ClientOptions& options) {
  COFAB_ASSIGN_OR_RETURN(auto impl, startImpl(&store, rank, worldSize, options));
  return std::unique_ptr<ModelClient>(new ModelClient(std::move(impl)));
}

StatusOr<std::unique_ptr<ModelClient>> ModelClient::connect(int rank, int worldSize,
                                                            const ClientOptions& options) {
  COFAB_ASSIGN_OR_RETURN(auto impl, startImpl(nullptr, rank, worldSize, options));
  return std::unique_ptr<ModelClient>(new ModelClient(std::move(impl)));
}

ModelClient::ModelClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ModelClient::~ModelClient() { close(); }

Status ModelClient::init(uint64_t key, TensorView value, Deadline deadline) {
  COFAB_RETURN_IF_ERROR(checkF32(value, "init value").withContext(name("init", key)));
  auto call = impl_->begin(ControlOp::kModelInit, key, value.count, value.as<const float>(),
                           nullptr, 0, name("init", key));
  return impl_->wait(call, deadline);
}

StatusOr<uint64_t> ModelClient::pull(uint64_t key, TensorView out, Deadline deadline) {
  COFAB_RETURN_IF_ERROR(checkF32(out, "pull out").withContext(name("pull", key)));
  auto call = impl_->begin(ControlOp::kModelPull, key, out.count, nullptr, out.as<float>(), 0,
                           name("pull", key));
  COFAB_RETURN_IF_ERROR(impl_->wait(call, deadline));
  std::lock_guard<std::mutex> lock(call->mu);
  return call->minVersion;
}

StatusOr<ApplyResult> ModelClient::apply(uint64_t key, TensorView delta, uint64_t clock,
                                         Deadline deadline) {
  const std::string what = name("apply", key) + " clock=" + std::to_string(clock);
  COFAB_RETURN_IF_ERROR(checkF32(delta, "apply delta").withContext(what));
  if (clock > (1ull << 62)) return InvalidArgument(what + ": clock out of range");
  auto call = impl_->begin(ControlOp::kModelApply, key, delta.count, delta.as<const float>(),
                           nullptr, clock, what);
  COFAB_RETURN_IF_ERROR(impl_->wait(call, deadline));
  std::lock_guard<std::mutex> lock(call->mu);
  return resultOf(*call);
}

StatusOr<std::vector<ApplyResult>> ModelClient::applyAndPull(std::span<const ModelUpdate> updates,
                                                             Deadline deadline) {
  for (const ModelUpdate& u : updates) {
    const std::string what = name("apply-pull", u.key);
    COFAB_RETURN_IF_ERROR(checkF32(u.delta, "apply-pull delta").withContext(what));
    COFAB_RETURN_IF_ERROR(checkF32(u.out, "apply-pull out").withContext(what));
    COFAB_RETURN_IF_ERROR(checkSameShape(u.delta, u.out, "apply-pull delta/out").withContext(what));
  }
  // All or nothing at the start: an update that cannot be sent (no base version, a daemon gone)
  // refuses the whole step before any request goes out, so a retry applies nothing twice.
  std::vector<Impl::Spec> specs;
  specs.reserve(updates.size());
  for (const ModelUpdate& u : updates) {
    specs.push_back(Impl::Spec{u.key, u.delta.count, u.delta.as<const float>(), u.out.as<float>(),
                               0, name("apply-pull", u.key)});
  }
  std::vector<std::shared_ptr<Call>> calls = impl_->beginAll(ControlOp::kModelApplyPull, specs);
  // Every call is waited for (or withdrawn at the deadline), even after one failed, so nothing
  // writes into the callers' `out` tensors after this returns.
  Status first;
  for (auto& call : calls) {
    Status st = impl_->wait(call, deadline);
    if (first.ok() && !st.ok()) first = st;
  }
  COFAB_RETURN_IF_ERROR(first);
  std::vector<ApplyResult> results;
  results.reserve(calls.size());
  for (auto& call : calls) {
    std::lock_guard<std::mutex> lock(call->mu);
    results.push_back(resultOf(*call));
  }
  return results;
}

Status ModelClient::elastic(uint64_t key, TensorView x, float alpha, TensorView diffOut,
                            Deadline deadline) {
  const std::string what = name("elastic", key);
  COFAB_RETURN_IF_ERROR(checkF32(x, "elastic x").withContext(what));
  COFAB_RETURN_IF_ERROR(checkF32(diffOut, "elastic diffOut").withContext(what));
  COFAB_RETURN_IF_ERROR(checkSameShape(x, diffOut, "elastic x/diffOut").withContext(what));
  if (!(alpha > 0.0f && alpha <= 1.0f)) {
    return InvalidArgument(what + ": alpha must be in (0, 1], got " + std::to_string(alpha));
  }
  uint32_t bits = 0;
  std::memcpy(&bits, &alpha, sizeof(bits));
  auto call = impl_->begin(ControlOp::kModelElastic, key, x.count, x.as<const float>(),
                           diffOut.as<float>(), bits, what);
  return impl_->wait(call, deadline);
}

void ModelClient::leave() { impl_->leave(); }
void ModelClient::close() { impl_->close(); }
int ModelClient::rank() const { return impl_->rank_; }
int ModelClient::numServers() const { return static_cast<int>(impl_->servers_.size()); }
size_t ModelClient::chunkBytes() const { return impl_->chunkBytes_; }
ClientStats ModelClient::stats() const {
  ClientStats s;
  s.bytesOut = impl_->bytesOut_.load();
  s.bytesIn = impl_->bytesIn_.load();
  return s;
}

}  // namespace cofab::ps
