#include "fabric/coded/coded_master.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/log.h"
#include "core/param.h"
#include "fabric/transport/registry.h"
#include "gpu/device.h"

namespace cofab::coded {

COFAB_PARAM_INT(kCodedRequestTimeoutMs, "COFAB_CODED_REQUEST_TIMEOUT_MS", 10000, 1, 3600000,
                "coded task service: deadline of one multiply request on the master");
COFAB_PARAM_ENUM(kCodedDevice, "COFAB_CODED_DEVICE", "cpu",
                 (std::vector<std::string>{"cpu", "gpu"}),
                 "coded task service: where the master encodes and decodes (gpu: CUDA device 0) "
                 "when CodedServiceOptions::device / --device is not given");
namespace {

std::string workerList(const std::vector<int>& ws) {
  std::string s;
  for (int w : ws) s += (s.empty() ? "" : ", ") + std::to_string(w);
  return s.empty() ? "none" : s;
}

double msSince(int64_t t0) { return (nowNs() - t0) / 1e6; }
}  // namespace

const char* codedModeName(CodedMode mode) {
  switch (mode) {
    case CodedMode::kCoded:
      return "coded";
    case CodedMode::kUncoded:
      return "uncoded";
    case CodedMode::kReplicated:
      return "replicated";
  }
  return "unknown";
}

StatusOr<CodedMode> parseCodedMode(const std::string& name) {
  if (name == "coded") return CodedMode::kCoded;
  if (name == "uncoded") return CodedMode::kUncoded;
  if (name == "replicated") return CodedMode::kReplicated;
  return InvalidArgument("coded mode '" + name + "': expected coded, uncoded or replicated");
}

constexpr size_t kKeptCancelReports = 4096;

struct CodedMaster::State {
  std::mutex mu;
  std::condition_variable cv;
  int n = 0;
  std::vector<std::shared_ptr<transport::Connection>> conns;  // by worker; null until registered
  std::vector<std::string> dead;                              // "" while alive
  std::vector<bool> loaded;                                   // acknowledged load number `load`
  // The running load's number, carried by kLoad and echoed by kLoaded: a late ack for an
  // earlier load (one that timed out) must not count for this one.
  uint64_t load = 0;
  std::string registerError;  // a connection that registered badly
  int badRegistrations = 0;   // connections that failed or registered badly (closed)
  // The running request.
  uint64_t current = 0;
  size_t expectBytes = 0;
  std::vector<int> arrivalOrder;
  std::vector<std::vector<uint8_t>> results;  // by worker
  std::vector<bool> hasResult;
  std::vector<std::string> taskError;  // by worker, "" when none
  std::vector<CancelReport> cancels;
  // Compute requests (each holding its B) handed to a worker's connection and not yet sent.
  std::vector<int> unsentComputes;
  // Blocks of A handed to a worker's connection and not yet sent (one that reads nothing holds at
  // most one unacknowledged: see load()),
  // and the number of the last load whose block was handed over: requests go only to workers
  // that hold the running load's block (a request follows its block on the connection).
  std::vector<int> unsentLoads;
  std::vector<uint64_t> sentLoad;

  void markDead(int w, const std::string& why) {
    if (dead[w].empty()) dead[w] = "worker " + std::to_string(w) + ": " + why;
    cv.notify_all();
  }

  void onMessage(int w, const Status& st, const wire::Header& h, std::vector<uint8_t>&& p) {
    std::lock_guard<std::mutex> lock(mu);
    if (!st.ok()) {
      markDead(w, st.toString());
      return;
    }
    switch (static_cast<CodedOp>(h.opcode)) {
      case CodedOp::kLoaded:
        if (h.sequence == load) loaded[w] = true;
        break;
      case CodedOp::kResult:
        if (h.sequence != current || hasResult[w]) break;  // late: that request is over
        if (p.size() != expectBytes) {
          taskError[w] = "worker " + std::to_string(w) + " sent a result of " +
                         std::to_string(p.size()) + " bytes, expected " +
                         std::to_string(expectBytes);
          break;
        }
        results[w] = std::move(p);
        hasResult[w] = true;
        arrivalOrder.push_back(w);
        break;
      case CodedOp::kCancelReport: {
        StatusOr<CancelRecord> r = parseCancel(p);
        if (!r.ok()) {
          markDead(w, r.status().toString());
          conns[w]->close();
          return;
        }
        cancels.push_back({w, h.sequence, static_cast<CancelStage>(r->stage), r->rowBlocksDone,
                           r->rowBlocksTotal});
        // Bounded: a long-running service keeps only the recent reports.
        if (cancels.size() > kKeptCancelReports) {
          cancels.erase(cancels.begin(), cancels.begin() + cancels.size() / 2);
        }
        break;
      }
      case CodedOp::kTaskError:
        if (h.sequence == current) taskError[w] = std::string(p.begin(), p.end());
        break;
      default:
        markDead(w, std::string("unexpected message '") + codedOpName(h.opcode) + "'");
        conns[w]->close();
        return;
    }
    cv.notify_all();
  }
};

namespace {
// Compute requests queued on a worker's connection, unsent, beyond which it is sent no more.
constexpr int kMaxUnsentComputes = 2;

void postRecv(const std::shared_ptr<CodedMaster::State>& s, int w) {
  std::shared_ptr<transport::Connection> c;
  {
    std::lock_guard<std::mutex> lock(s->mu);
    c = s->conns[w];
  }
  c->recvOwned([s, w](const Status& st, const wire::Header& h, std::vector<uint8_t>&& p) {
    s->onMessage(w, st, h, std::move(p));
    if (st.ok()) postRecv(s, w);
  });
}

void sendTo(const std::shared_ptr<transport::Connection>& c, const wire::Header& h,
            std::shared_ptr<const std::vector<uint8_t>> buf) {
  wire::Header hh = h;
  hh.payloadLength = buf ? buf->size() : 0;
  const void* data = buf ? buf->data() : nullptr;
  c->send(hh, data, hh.payloadLength, [buf](const Status&) {});
}

// Sends `buf` to worker w, counted in (s->*unsent)[w] until the transport is done with it (a
// worker that reads nothing keeps it counted: load() and multiply() stop queuing to it). The
// caller holds s->mu.
void sendCounted(const std::shared_ptr<CodedMaster::State>& s, int w,
                 std::vector<int> CodedMaster::State::*unsent, wire::Header h,
                 std::shared_ptr<const std::vector<uint8_t>> buf) {
  ++((*s).*unsent)[static_cast<size_t>(w)];
  h.payloadLength = buf->size();
  s->conns[static_cast<size_t>(w)]->send(h, buf->data(), buf->size(),
                                         [s, unsent, buf, w](const Status&) {
                                           std::lock_guard<std::mutex> l(s->mu);
                                           --((*s).*unsent)[static_cast<size_t>(w)];
                                         });
}
}  // namespace

CodedMaster::CodedMaster(const CodedServiceOptions& options)
    : options_(options), state_(std::make_shared<State>()) {}

int CodedMaster::needed() const {
  switch (options_.mode) {
    case CodedMode::kCoded:
      return options_.k;
    case CodedMode::kUncoded:
      return options_.n;
    case CodedMode::kReplicated:
      return options_.n / options_.replicas;
  }
  return options_.n;
}

StatusOr<std::unique_ptr<CodedMaster>> CodedMaster::create(Store* store,
                                                           const CodedServiceOptions& options) {
  if (store == nullptr) return InvalidArgument("coded master: store is null");
  if (options.n < 1 || options.n > 64) {
    return InvalidArgument("coded master: n=" + std::to_string(options.n) + " outside [1, 64]");
  }
  if (options.mode == CodedMode::kCoded && (options.k < 1 || options.k >= options.n)) {
    return InvalidArgument("coded master: coded mode needs 1 <= k < n, got n=" +
                           std::to_string(options.n) + " k=" + std::to_string(options.k));
  }
  if (options.mode == CodedMode::kReplicated &&
      (options.replicas < 1 || options.n % options.replicas != 0)) {
    return InvalidArgument("coded master: replicas=" + std::to_string(options.replicas) +
                           " must divide n=" + std::to_string(options.n));
  }
  if (options.rowBlock < 1) return InvalidArgument("coded master: rowBlock must be >= 1");
  // `!(x >= 0)` and isfinite: NaN fails every comparison and +inf would reach the workers'
  // duration_cast (undefined behaviour).
  if (!(options.shiftMs >= 0) || !std::isfinite(options.shiftMs) || !(options.tailMeanMs >= 0) ||
      !std::isfinite(options.tailMeanMs)) {
    return InvalidArgument("coded master: injected delays must be finite and >= 0 (shiftMs " +
                           std::to_string(options.shiftMs) + ", tailMeanMs " +
                           std::to_string(options.tailMeanMs) + ")");
  }
  for (const auto& [w, ms] : options.rowBlockDelayMs) {
    if (w < 0 || w >= options.n || !(ms >= 0) || !std::isfinite(ms)) {
      return InvalidArgument("coded master: rowBlockDelayMs for worker " + std::to_string(w) +
                             " (" + std::to_string(ms) +
                             " ms) is out of range (a worker index below n, a finite delay >= 0)");
    }
  }
  std::unique_ptr<CodedMaster> m(new CodedMaster(options));
  if (m->options_.device.empty()) {
    COFAB_ASSIGN_OR_RETURN(m->options_.device, kCodedDevice.get());
  }
  if (m->options_.device == "gpu") {
    // Checked before listening: a master that cannot encode as asked must not gather workers.
    if (StatusOr<int> gpus = gpu::deviceCount(); !gpus.ok()) {
      return Unavailable(
          "coded master: device=gpu was asked for (CodedServiceOptions::device, "
          "--device or COFAB_CODED_DEVICE) but no GPU is usable: " +
          gpus.status().message() + "; use device=cpu");
    }
    m->device_ = Device::cuda(0);
  } else if (m->options_.device != "cpu") {
    return InvalidArgument("coded master: device '" + m->options_.device +
                           "': expected cpu or gpu");
  }
  if (options.mode == CodedMode::kCoded) {
    // Once, and before workers are gathered: the code's survey of its decoding patterns (its
    // conditioning) costs up to seconds, and the code depends on nothing load() is given.
    COFAB_ASSIGN_OR_RETURN(
        coding::CodedMatmul cm,
        coding::CodedMatmul::create({.n = options.n,
                                     .k = options.k,
                                     .family = options.family,
                                     .seed = options.codeSeed,
                                     .maxCondition = options.maxCondition}));
    m->code_.emplace(std::move(cm));
  }
  COFAB_ASSIGN_OR_RETURN(m->options_.setupTimeout, codedSetupTimeout(options.setupTimeout));
  if (options.requestTimeout == Duration{0}) {
    COFAB_ASSIGN_OR_RETURN(int64_t ms, kCodedRequestTimeoutMs.get());
    m->options_.requestTimeout = Millis(ms);
  }
  const int n = options.n;
  State& s = *m->state_;
  s.n = n;
  s.conns.assign(n, nullptr);
  s.dead.assign(n, "");
  s.loaded.assign(n, false);
  s.results.assign(n, {});
  s.hasResult.assign(n, false);
  s.taskError.assign(n, "");
  s.unsentComputes.assign(n, 0);
  s.unsentLoads.assign(n, 0);
  s.sentLoad.assign(n, 0);

  const Deadline deadline = Deadline::after(m->options_.setupTimeout);
  COFAB_ASSIGN_OR_RETURN(
      m->ctx_, transport::Registry::create(options.transport, {.localId = "coded master"}));
  COFAB_ASSIGN_OR_RETURN(m->listener_, m->ctx_->listen({.address = options.listenAddress}));
  COFAB_RETURN_IF_ERROR(store->set(options.name + "/master", toBytes(m->listener_->address())));

  // Each accepted connection's first message says which worker it is. Accepting stops when every
  // worker registered, and waits while as many connections are still to say who they are as
  // workers are missing; one that fails or registers badly (a port probe, a crashed worker's
  // retry, a duplicate index) frees its place. A fixed n accepts let it take a worker's place.
  auto state = m->state_;
  int accepted = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(s.mu);
      const auto registered = [&] {
        return static_cast<int>(std::count_if(s.conns.begin(), s.conns.end(),
                                              [](const auto& c) { return c != nullptr; }));
      };
      const auto room = [&] { return accepted - s.badRegistrations < n; };
      s.cv.wait_until(lock, deadline.when(), [&] { return registered() == n || room(); });
      if (registered() == n || !room()) break;  // all in, or the deadline with no room
    }
    StatusOr<std::shared_ptr<transport::Connection>> c = m->listener_->accept(deadline);
    if (!c.ok()) break;  // reported below, naming the workers that did not register
    ++accepted;
    std::shared_ptr<transport::Connection> conn = *c;
    conn->recvOwned([state, conn](const Status& st, const wire::Header& h, std::vector<uint8_t>&&) {
      bool ok = false;
      int w = static_cast<int>(h.senderRank);
      {
        std::lock_guard<std::mutex> lock(state->mu);
        if (!st.ok()) {
          state->registerError = conn->describe() + ": " + st.toString();
        } else if (h.opcode != static_cast<uint8_t>(CodedOp::kRegister) || w < 0 || w >= state->n ||
                   state->conns[w] != nullptr) {
          state->registerError = conn->describe() + ": bad registration (" + h.describe() +
                                 "; worker index must be new and in [0, " +
                                 std::to_string(state->n) + "))";
        } else {
          state->conns[w] = conn;
          ok = true;
        }
        if (!ok) ++state->badRegistrations;
        state->cv.notify_all();
      }
      if (ok) {
        postRecv(state, w);
      } else {
        conn->close();
      }
    });
  }
  std::unique_lock<std::mutex> lock(s.mu);
  s.cv.wait_until(lock, deadline.when(), [&] {
    return std::all_of(s.conns.begin(), s.conns.end(), [](const auto& c) { return c != nullptr; });
  });
  std::vector<int> missing;
  for (int w = 0; w < n; ++w) {
    if (s.conns[w] == nullptr) missing.push_back(w);
  }
  if (!missing.empty()) {
    std::string msg = "coded master '" + options.name + "' at " + m->listener_->address() +
                      ": workers " + workerList(missing) + " did not register in time";
    if (!s.registerError.empty()) msg += " (also: " + s.registerError + ")";
    lock.unlock();
    return DeadlineExceeded(msg);
  }
  lock.unlock();
  // Every worker is in: nobody else is accepted from now on. An open listener let a late worker
  // (restarted, or with an index already taken) connect and register into a queue nobody reads,
  // and wait there for as long as this master lived; closed, its connect is refused and it fails
  // at its setup deadline saying why.
  m->listener_.reset();
  return m;
}

CodedMaster::~CodedMaster() {
  if (ctx_ == nullptr) return;
  std::vector<std::shared_ptr<transport::Connection>> conns;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    conns = state_->conns;
  }
  // Tell the live workers to leave, and give the messages a moment to reach the sockets before
  // the context closes the connections.
  auto pending = std::make_shared<std::atomic<int>>(0);
  for (auto& c : conns) {
    if (c == nullptr || !c->status().ok()) continue;
    pending->fetch_add(1);
    c->send(codedHeader(CodedOp::kShutdown, 0, 0), nullptr, 0,
            [pending](const Status&) { pending->fetch_sub(1); });
  }
  const Deadline d = Deadline::afterMs(2000);
  while (pending->load() > 0 && !d.expired()) std::this_thread::sleep_for(Millis(1));
  // Then let the workers close their ends first (the receive loops mark them dead): closing
  // ours while a straggler's last message is still unread resets the connection, and the
  // worker may read that reset instead of the Shutdown and report a failed master.
  {
    State& s = *state_;
    std::unique_lock<std::mutex> lock(s.mu);
    s.cv.wait_until(lock, d.when(), [&] {
      for (int w = 0; w < s.n; ++w) {
        if (s.conns[static_cast<size_t>(w)] != nullptr && s.dead[static_cast<size_t>(w)].empty()) {
          return false;
        }
      }
      return true;
    });
  }
  ctx_->join();
}

int CodedMaster::blockGroups() const {
  return options_.mode == CodedMode::kReplicated ? needed() : options_.n;
}

int CodedMaster::coveredGroups(const std::function<bool(int)>& holds) const {
  const int groups = blockGroups();
  std::vector<bool> covered(groups, false);
  int count = 0;
  for (int w = 0; w < options_.n; ++w) {
    if (!covered[w % groups] && holds(w)) {
      covered[w % groups] = true;
      ++count;
    }
  }
  return count;
}

Status CodedMaster::checkLive(const char* what) const {
  State& s = *state_;
  const int need = needed();
  const int live = coveredGroups([&](int w) { return s.dead[w].empty(); });
  if (live >= need) return OkStatus();
  std::vector<int> deadList;
  std::string reasons;
  for (int w = 0; w < options_.n; ++w) {
    if (!s.dead[w].empty()) {
      deadList.push_back(w);
      reasons += "; " + s.dead[w];
    }
  }
  return FailedPrecondition(std::string(what) + ": " + codedModeName(options_.mode) + " (n=" +
                            std::to_string(options_.n) + ") needs " + std::to_string(need) +
                            " live block groups, only " + std::to_string(live) +
                            " remain; dead workers: " + workerList(deadList) + reasons);
}

Status CodedMaster::load(coding::ConstMatrixView a) {
  COFAB_RETURN_IF_ERROR(a.validate("coded load A"));
  if (a.rows <= 0 || a.cols <= 0) return InvalidArgument("coded load: A is empty");
  const int n = options_.n;
  const int m = needed();
  // A block has ceil(rows / m) rows in every mode (the coded split pads like the others; rows is
  // bounded by validate(), so rows + m - 1 cannot overflow). A block that cannot travel is
  // refused before anything changes here or on the workers.
  COFAB_RETURN_IF_ERROR(checkMatrixMessage("coded load: a block of A", (a.rows + m - 1) / m, a.cols,
                                           sizeof(LoadRecord)));
  // blocks[w] = the floats worker w holds.
  std::vector<const float*> blockOf(n);
  std::vector<float> split;
  if (options_.mode == CodedMode::kCoded) {
    COFAB_ASSIGN_OR_RETURN(coding::EncodedMatrix e, code_->encode(a, device_));
    encoded_.emplace(std::move(e));
    blockRows_ = encoded_->blockRows();
    for (int w = 0; w < n; ++w) blockOf[w] = encoded_->block(w).data;
  } else {
    blockRows_ = (a.rows + m - 1) / m;
    split.assign(static_cast<size_t>(blockRows_ * m * a.cols), 0.0f);  // padding rows stay 0
    for (int64_t r = 0; r < a.rows; ++r) {
      std::memcpy(split.data() + r * a.cols, a.row(r), sizeof(float) * a.cols);
    }
    for (int w = 0; w < n; ++w) blockOf[w] = split.data() + (w % m) * blockRows_ * a.cols;
  }
  aRows_ = a.rows;
  aCols_ = a.cols;
  State& s = *state_;
  std::unique_lock<std::mutex> lock(s.mu);
  COFAB_RETURN_IF_ERROR(checkLive("coded load"));
  ++s.load;
  for (int w = 0; w < n; ++w) {
    const bool ackedPrevious = s.loaded[w];
    s.loaded[w] = false;
    if (!s.dead[w].empty()) continue;
    // Its previous block has not even left this host: the worker reads nothing (stopped,
    // stuck). Queuing this one too grew the process by a block per load for as long as that
    // lasted. It gets no request until a later load reaches it (sentLoad). A block the worker
    // acknowledged has left, even if its send's completion has not come back yet.
    if (s.unsentLoads[w] > 0 && !ackedPrevious) continue;
    LoadRecord rec{.rows = blockRows_,
                   .cols = a.cols,
                   .tasks = n,
                   .rowBlock = options_.rowBlock,
                   .load = options_.loadScaledDelay ? 1.0 / m : 1.0,
                   .shiftMs = options_.shiftMs,
                   .tailMeanMs = options_.tailMeanMs,
                   .seed = options_.delaySeed,
                   .rowBlockDelayMs = 0};
    if (auto it = options_.rowBlockDelayMs.find(w); it != options_.rowBlockDelayMs.end()) {
      rec.rowBlockDelayMs = it->second;
    }
    auto buf = std::make_shared<const std::vector<uint8_t>>(packRecord(
        rec, std::span<const float>(blockOf[w], static_cast<size_t>(blockRows_ * a.cols))));
    s.sentLoad[w] = s.load;
    sendCounted(state_, w, &State::unsentLoads, codedHeader(CodedOp::kLoad, 0, s.load), buf);
  }
  const Deadline deadline = Deadline::after(options_.setupTimeout);
  // Enough workers hold their block for a request to complete from them alone (as multiply()
  // counts: any k in coded mode, one replica per block group, every block uncoded). A straggler
  // must not hold up load() any more than a request: the others' acks suffice, and its block
  // still reaches it ahead of any request on its connection.
  auto enoughLoaded = [&] {
    return coveredGroups([&](int w) { return s.dead[w].empty() && s.loaded[w]; }) >= m;
  };
  // Only workers sent this load's block can help (one passed over above cannot).
  auto sent = [&](int w) { return s.dead[w].empty() && s.sentLoad[w] == s.load; };
  auto tooFewLive = [&] { return coveredGroups(sent) < m; };
  auto notLoaded = [&] {
    std::vector<int> late;
    for (int w = 0; w < n; ++w) {
      if (sent(w) && !s.loaded[w]) late.push_back(w);
    }
    return late;
  };
  auto passedOver = [&] {
    std::vector<int> skipped;
    for (int w = 0; w < n; ++w) {
      if (s.dead[w].empty() && s.sentLoad[w] != s.load) skipped.push_back(w);
    }
    return skipped;
  };
  s.cv.wait_until(lock, deadline.when(), [&] { return enoughLoaded() || tooFewLive(); });
  if (!enoughLoaded()) {
    COFAB_RETURN_IF_ERROR(checkLive("coded load"));
    const std::vector<int> skipped = passedOver();
    const std::string why =
        skipped.empty() ? ""
                        : "; workers " + workerList(skipped) +
                              " were not sent it: their previous block is still queued here (they "
                              "read nothing)";
    if (tooFewLive()) {
      return Unavailable("coded load: too few workers could take the block" + why);
    }
    return DeadlineExceeded("coded load: workers " + workerList(notLoaded()) +
                            " did not acknowledge their block in time" + why);
  }
  if (std::vector<int> late = notLoaded(); !late.empty()) {
    COFAB_LOG(kInfo, "coded") << "load " << s.load << ": workers " << workerList(late)
                              << " have not acknowledged their block yet; requests do not wait "
                                 "for them";
  }
  return checkLive("coded load");
}

StatusOr<RequestReport> CodedMaster::multiply(coding::ConstMatrixView b, coding::MatrixView c) {
  COFAB_RETURN_IF_ERROR(b.validate("coded multiply B"));
  COFAB_RETURN_IF_ERROR(c.validate("coded multiply C"));
  if (aRows_ == 0) return FailedPrecondition("coded multiply: load(A) first");
  if (b.rows != aCols_ || c.rows != aRows_ || c.cols != b.cols || b.cols <= 0) {
    return InvalidArgument("coded multiply: A is " + std::to_string(aRows_) + "x" +
                           std::to_string(aCols_) + ", B " + std::to_string(b.rows) + "x" +
                           std::to_string(b.cols) + ", C " + std::to_string(c.rows) + "x" +
                           std::to_string(c.cols));
  }
  // B goes to every worker and each answers blockRows x bCols: both must fit a message, or the
  // receiving side's connection fails (a worker lost for good, or a result never accepted).
  COFAB_RETURN_IF_ERROR(
      checkMatrixMessage("coded multiply: B", b.rows, b.cols, sizeof(ComputeRecord)));
  COFAB_RETURN_IF_ERROR(
      checkMatrixMessage("coded multiply: a worker's result", blockRows_, b.cols, 0));
  const int n = options_.n;
  const int need = needed();
  const int groups = blockGroups();
  State& s = *state_;
  RequestReport report;
  report.request = nextRequest_++;

  // B contiguous behind its record: one buffer shared by all the sends.
  std::vector<float> bDense(static_cast<size_t>(b.rows * b.cols));
  for (int64_t r = 0; r < b.rows; ++r) {
    std::memcpy(bDense.data() + r * b.cols, b.row(r), sizeof(float) * b.cols);
  }
  auto buf = std::make_shared<const std::vector<uint8_t>>(
      packRecord(ComputeRecord{b.rows, b.cols}, bDense));

  std::unique_lock<std::mutex> lock(s.mu);
  COFAB_RETURN_IF_ERROR(checkLive("coded multiply"));
  s.current = report.request;
  s.expectBytes = static_cast<size_t>(blockRows_ * b.cols) * sizeof(float);
  s.arrivalOrder.clear();
  for (int w = 0; w < n; ++w) {
    s.results[w].clear();
    s.hasResult[w] = false;
    s.taskError[w].clear();
  }
  const int64_t t0 = nowNs();
  for (int w = 0; w < n; ++w) {
    if (!s.dead[w].empty()) continue;
    if (s.sentLoad[w] != s.load) {
      s.taskError[w] = "worker " + std::to_string(w) +
                       ": not sent this request, it was not sent the loaded matrix (its "
                       "previous block was still queued here: the worker reads nothing)";
      continue;
    }
    if (s.unsentComputes[w] >= kMaxUnsentComputes) {
      // Its last requests have not even left this host: the worker reads nothing (stopped,
      // stuck, cut off without a reset), so it cannot help this one either. Another copy of B
      // queued behind them grew this process by one B per request for as long as that lasted.
      // (One unsent is normal: a send's completion may come after the worker's answer.)
      s.taskError[w] = "worker " + std::to_string(w) +
                       ": not sent this request, its previous ones are still queued here (the "
                       "worker reads nothing: stopped or stuck)";
      continue;
    }
    sendCounted(state_, w, &State::unsentComputes,
                codedHeader(CodedOp::kCompute, 0, report.request), buf);
  }
  const Deadline deadline = Deadline::after(options_.requestTimeout);

  // used = the arrivals that each completed a new group, up to `need`.
  auto chooseUsed = [&] {
    std::vector<int> used;
    std::vector<bool> covered(groups, false);
    for (int w : s.arrivalOrder) {
      if (static_cast<int>(used.size()) == need) break;
      if (!covered[w % groups]) {
        covered[w % groups] = true;
        used.push_back(w);
      }
    }
    return used;
  };
  // Can the groups not yet covered still be covered by workers that may answer?
  auto stillPossible = [&](int covered) {
    std::vector<bool> coverable(groups, false);
    for (int w = 0; w < n; ++w) {
      if (!s.hasResult[w] && s.dead[w].empty() && s.taskError[w].empty()) {
        coverable[w % groups] = true;
      }
    }
    for (int w : s.arrivalOrder) coverable[w % groups] = false;
    return covered + std::count(coverable.begin(), coverable.end(), true) >= need;
  };
  std::vector<int> used;
  bool timedOut = false;
  while (true) {
    used = chooseUsed();
    if (static_cast<int>(used.size()) == need) break;
    if (!stillPossible(static_cast<int>(used.size()))) break;
    if (s.cv.wait_until(lock, deadline.when()) == std::cv_status::timeout) {
      used = chooseUsed();
      timedOut = static_cast<int>(used.size()) < need;
      break;
    }
  }
  report.completionMs = msSince(t0);
  // Cancel every live worker that has not answered: it abandons the task at once.
  std::vector<int> silent;
  std::string failures;
  for (int w = 0; w < n; ++w) {
    if (s.hasResult[w]) continue;
    if (!s.dead[w].empty()) {
      failures += "; " + s.dead[w];
      continue;
    }
    if (!s.taskError[w].empty()) {
      failures += "; " + s.taskError[w];
      continue;
    }
    silent.push_back(w);
    report.cancelled.push_back(w);
    sendTo(s.conns[w], codedHeader(CodedOp::kCancel, 0, report.request), nullptr);
  }
  if (static_cast<int>(used.size()) < need) {
    s.current = 0;
    const std::string what = "coded request " + std::to_string(report.request) + " (" +
                             codedModeName(options_.mode) + ", needs " + std::to_string(need) +
                             " of " + std::to_string(groups) + " block groups, got " +
                             std::to_string(used.size()) + ")";
    if (timedOut) {
      return DeadlineExceeded(what + ": no result within " +
                              std::to_string(options_.requestTimeout.count() / 1000000) +
                              " ms from workers " + workerList(silent) + failures);
    }
    return Unavailable(what + ": too many workers failed" + failures);
  }
  // The results stay in s.results until the next request; decoding reads them in place.
  std::vector<std::vector<uint8_t>> taken(n);
  for (int w : used) taken[w] = std::move(s.results[w]);
  s.current = 0;
  lock.unlock();

  const int64_t t1 = nowNs();
  report.used = used;
  if (options_.mode == CodedMode::kCoded) {
    std::vector<coding::TaskResult> results;
    for (int w : used) results.push_back({w, reinterpret_cast<const float*>(taken[w].data())});
    COFAB_ASSIGN_OR_RETURN(coding::DecodeReport d,
                           code_->decode(*encoded_, results, b.cols, c, device_));
    report.decoded = d.decoded;
    report.condition = d.condition;
  } else {
    for (int w : used) {
      const int blk = w % groups;
      const int64_t first = blk * blockRows_;
      const int64_t rows = std::min(blockRows_, aRows_ - first);
      const float* src = reinterpret_cast<const float*>(taken[w].data());
      for (int64_t r = 0; r < rows; ++r) {
        std::memcpy(c.row(first + r), src + r * b.cols, sizeof(float) * b.cols);
      }
    }
  }
  report.decodeMs = msSince(t1);
  report.totalMs = msSince(t0);
  return report;
}

StatusOr<std::vector<CancelReport>> CodedMaster::waitCancelReports(uint64_t request,
                                                                   const std::vector<int>& workers,
                                                                   Deadline deadline) {
  State& s = *state_;
  for (int w : workers) {
    if (w < 0 || w >= options_.n) {
      return InvalidArgument("cancel reports: worker " + std::to_string(w) + " outside [0, " +
                             std::to_string(options_.n) + ")");
    }
  }
  std::unique_lock<std::mutex> lock(s.mu);
  auto missing = [&] {
    std::vector<int> out;
    for (int w : workers) {
      const bool have = std::any_of(s.cancels.begin(), s.cancels.end(), [&](const CancelReport& r) {
        return r.worker == w && r.request == request;
      });
      if (!have) out.push_back(w);
    }
    return out;
  };
  // A dead worker's report will never come (markDead wakes this wait).
  auto allMissingDead = [&](const std::vector<int>& m) {
    return std::all_of(m.begin(), m.end(), [&](int w) { return !s.dead[w].empty(); });
  };
  s.cv.wait_until(lock, deadline.when(), [&] { return allMissingDead(missing()); });
  if (std::vector<int> m = missing(); !m.empty()) {
    const std::string what = "cancel reports for request " + std::to_string(request);
    if (allMissingDead(m)) {
      std::string reasons;
      for (int w : m) reasons += "; " + s.dead[w];
      return Unavailable(what + ": workers " + workerList(m) + " are dead" + reasons);
    }
    return DeadlineExceeded(what + ": none from workers " + workerList(m));
  }
  std::vector<CancelReport> out;
  for (const CancelReport& r : s.cancels) {
    if (r.request == request &&
        std::find(workers.begin(), workers.end(), r.worker) != workers.end()) {
      out.push_back(r);
    }
  }
  return out;
}

std::map<int, std::string> CodedMaster::deadWorkers() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  std::map<int, std::string> out;
  for (int w = 0; w < options_.n; ++w) {
    if (!state_->dead[w].empty()) out[w] = state_->dead[w];
  }
  return out;
}

}  // namespace cofab::coded
