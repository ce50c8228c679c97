#include "fabric/coded/coded_worker.h"

#include <algorithm>
#include <thread>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "coding/matmul/coded_matmul.h"
#include "coding/matmul/delay_model.h"
#include "core/log.h"
#include "fabric/coded/coded_protocol.h"
#include "fabric/transport/registry.h"

namespace cofab::coded {

namespace {

struct Job {
  CodedOp op;
  uint64_t request;
  std::vector<uint8_t> payload;
};

class Worker {
 public:
  Worker(const CodedWorkerOptions& o) : options_(o) {}
  Status run();

 private:
  void postRecv();
  void onMessage(const Status& st, const wire::Header& h, std::vector<uint8_t>&& payload);
  void send(CodedOp op, uint64_t request, std::vector<uint8_t> payload);
  void sendCancelReport(uint64_t request, CancelStage stage, int64_t done, int64_t total);
  bool cancelled(uint64_t request) const {
    return request <= cancelledThrough_.load(std::memory_order_acquire) || failed_.load();
  }
  // Waits `d` unless request is cancelled first; returns whether it was cancelled.
  bool sleepUnlessCancelled(uint64_t request, Duration d);
  // Row blocks in the loaded block: ceil(rows / rowBlock) without the overflow of
  // rows + rowBlock - 1 (a rowBlock of INT64_MAX means "never stop between blocks").
  int64_t rowBlocks() const {
    const int64_t rb = std::max<int64_t>(rec_.rowBlock, 1);
    return rec_.rows / rb + (rec_.rows % rb != 0 ? 1 : 0);
  }
  Status load(const Job& job);
  Status compute(const Job& job);

  const CodedWorkerOptions options_;
  std::shared_ptr<transport::Context> ctx_;
  std::shared_ptr<transport::Connection> conn_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;   // under mu_
  Status connError_;       // under mu_
  uint64_t lastDone_ = 0;  // under mu_: the last request answered (result or report)
  std::atomic<uint64_t> cancelledThrough_{0};
  std::atomic<bool> failed_{false};

  LoadRecord rec_;
  std::vector<float> block_;
  std::optional<coding::ShiftedExponentialDelay> delay_;
};

void Worker::send(CodedOp op, uint64_t request, std::vector<uint8_t> payload) {
  auto buf = std::make_shared<std::vector<uint8_t>>(std::move(payload));
  conn_->send(codedHeader(op, static_cast<uint32_t>(options_.index), request, buf->size()),
              buf->data(), buf->size(), [buf](const Status&) {});
}

void Worker::sendCancelReport(uint64_t request, CancelStage stage, int64_t done, int64_t total) {
  send(CodedOp::kCancelReport, request,
       packRecord(CancelRecord{static_cast<int64_t>(stage), done, total}));
}

void Worker::postRecv() {
  conn_->recvOwned([this](const Status& st, const wire::Header& h, std::vector<uint8_t>&& p) {
    onMessage(st, h, std::move(p));
  });
}

void Worker::onMessage(const Status& st, const wire::Header& h, std::vector<uint8_t>&& payload) {
  if (!st.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    connError_ = st;
    failed_ = true;
    cv_.notify_all();
    return;
  }
  const auto op = static_cast<CodedOp>(h.opcode);
  if (op == CodedOp::kCancel) {
    // Handled here, not queued: the compute thread may be busy with the very task cancelled.
    std::lock_guard<std::mutex> lock(mu_);
    if (lastDone_ >= h.sequence) {
      const int64_t total = rowBlocks();
      sendCancelReport(h.sequence, CancelStage::kFinished, total, total);
    } else if (h.sequence > cancelledThrough_.load()) {
      cancelledThrough_.store(h.sequence, std::memory_order_release);
    }
    cv_.notify_all();
  } else {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back({op, h.sequence, std::move(payload)});
    cv_.notify_all();
  }
  postRecv();
}

bool Worker::sleepUnlessCancelled(uint64_t request, Duration d) {
  std::unique_lock<std::mutex> lock(mu_);
  // Deadline::after saturates: a delay of Duration::max() ("never finishes") waits for the
  // cancellation only, where now + d would overflow.
  return cv_.wait_until(lock, Deadline::after(d).when(), [&] { return cancelled(request); });
}

Status Worker::load(const Job& job) {
  const float* data = nullptr;
  COFAB_ASSIGN_OR_RETURN(LoadRecord r, parseLoad(job.payload, &data));
  {
    std::lock_guard<std::mutex> lock(mu_);
    rec_ = r;
  }
  block_.assign(data, data + r.rows * r.cols);
  delay_.reset();
  if (r.shiftMs > 0 || r.tailMeanMs > 0) {
    COFAB_ASSIGN_OR_RETURN(coding::ShiftedExponentialDelay d,
                           coding::ShiftedExponentialDelay::create(
                               {.shiftMs = r.shiftMs, .tailMeanMs = r.tailMeanMs, .seed = r.seed}));
    delay_.emplace(d);
  }
  send(CodedOp::kLoaded, job.request, {});  // the load's number: the master checks it
  return OkStatus();
}

Status Worker::compute(const Job& job) {
  const uint64_t req = job.request;
  const int64_t total = rowBlocks();
  auto stopped = [&](CancelStage stage, int64_t done) {
    std::lock_guard<std::mutex> lock(mu_);
    lastDone_ = req;
    sendCancelReport(req, stage, done, total);
    return OkStatus();
  };
  if (cancelled(req)) return stopped(CancelStage::kQueued, 0);
  auto fail = [&](const Status& s) {
    std::lock_guard<std::mutex> lock(mu_);
    lastDone_ = req;
    const std::string text = "worker " + std::to_string(options_.index) + ": " + s.toString();
    send(CodedOp::kTaskError, req, std::vector<uint8_t>(text.begin(), text.end()));
    return OkStatus();
  };
  if (block_.empty()) return fail(FailedPrecondition("compute before load"));
  const float* bData = nullptr;
  StatusOr<ComputeRecord> parsed = parseCompute(job.payload, &bData);
  if (!parsed.ok()) return fail(parsed.status());
  const ComputeRecord b = *parsed;
  if (b.bRows != rec_.cols) {
    return fail(InvalidArgument("B has " + std::to_string(b.bRows) + " rows, the block has " +
                                std::to_string(rec_.cols) + " columns"));
  }
  // Before the allocation: rows x bCols may be up to 2^48 floats from a master that did not
  // check (bad_alloc would end this process), and a result past the limit cannot be sent.
  if (Status s = checkMatrixMessage("result", rec_.rows, b.bCols, 0); !s.ok()) return fail(s);
  if (delay_) {
    const Duration d = delay_->delay({.run = static_cast<int64_t>(req),
                                      .task = options_.index,
                                      .tasks = static_cast<int>(rec_.tasks),
                                      .load = rec_.load});
    if (sleepUnlessCancelled(req, d)) return stopped(CancelStage::kDelaying, 0);
  }
  std::vector<float> out(static_cast<size_t>(rec_.rows * b.bCols));
  const Duration extra = coding::durationFromMs(rec_.rowBlockDelayMs);
  for (int64_t rb = 0; rb < total; ++rb) {
    // The cancellation check between row blocks: a cancelled task stops within one block.
    if (cancelled(req)) return stopped(CancelStage::kComputing, rb);
    if (rec_.rowBlockDelayMs > 0 && sleepUnlessCancelled(req, extra)) {
      return stopped(CancelStage::kComputing, rb);
    }
    const int64_t first = rb * rec_.rowBlock;
    const int64_t rows = std::min(rec_.rowBlock, rec_.rows - first);
    Status s = coding::gemmF32({block_.data() + first * rec_.cols, rows, rec_.cols, 0},
                               {bData, b.bRows, b.bCols, 0},
                               {out.data() + first * b.bCols, rows, b.bCols, 0});
    if (!s.ok()) return fail(s);
  }
  std::lock_guard<std::mutex> lock(mu_);
  lastDone_ = req;
  if (cancelled(req)) {
    // The cancel arrived after the last row block: the work is done, the result unwanted.
    sendCancelReport(req, CancelStage::kFinished, total, total);
    return OkStatus();
  }
  std::vector<uint8_t> bytes(out.size() * sizeof(float));
  std::memcpy(bytes.data(), out.data(), bytes.size());
  send(CodedOp::kResult, req, std::move(bytes));
  return OkStatus();
}

Status Worker::run() {
  if (options_.store == nullptr) return InvalidArgument("coded worker: store is null");
  if (options_.index < 0) return InvalidArgument("coded worker: index must be >= 0");
  COFAB_ASSIGN_OR_RETURN(Duration timeout, codedSetupTimeout(options_.setupTimeout));
  const Deadline deadline = Deadline::after(timeout);
  const std::string id = "coded worker " + std::to_string(options_.index);
  COFAB_ASSIGN_OR_RETURN(ctx_, transport::Registry::create(options_.transport, {.localId = id}));
  // The address is read again after each second of failed connecting: the key may still hold
  // an earlier run's master (a restarted master, a second run on one store), which nobody serves;
  // a worker that read it once dialled that dead port until its setup deadline.
  StatusOr<std::shared_ptr<transport::Connection>> conn = Unavailable("not connected");
  while (!conn.ok()) {
    StatusOr<Bytes> addr = options_.store->get(options_.name + "/master", deadline);
    if (!addr.ok()) {
      ctx_->join();
      return addr.status().withContext(id + ": waiting for the master's address");
    }
    conn = ctx_->connect(toString(*addr), {.localId = id}, Deadline::afterMs(1000).min(deadline));
    if (conn.ok()) break;
    const StatusCode code = conn.status().code();
    // Only "nobody there yet" is worth another try; a closed context or a bad address is not.
    if (deadline.expired() ||
        (code != StatusCode::kUnavailable && code != StatusCode::kDeadlineExceeded &&
         code != StatusCode::kRemoteError)) {
      ctx_->join();
      std::string where = id + ": master at " + toString(*addr);
      if (deadline.expired()) {
        where +=
            " (a master takes its workers only while it is being created: one started "
            "after that, or with an index already taken, finds nobody listening)";
      }
      return conn.status().withContext(where);
    }
    // A refusal can come back at once: pause before reading the address and dialling again.
    std::this_thread::sleep_for(std::min<Duration>(Millis(100), deadline.remaining()));
  }
  conn_ = *conn;
  send(CodedOp::kRegister, 0, {});
  postRecv();

  Status result;
  while (true) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !jobs_.empty() || !connError_.ok(); });
      if (jobs_.empty()) {
        result = connError_.withContext(id + ": connection to the master failed");
        break;
      }
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    if (job.op == CodedOp::kShutdown) break;
    Status s;
    if (job.op == CodedOp::kLoad) {
      s = load(job);
    } else if (job.op == CodedOp::kCompute) {
      s = compute(job);
    } else {
      s = InvalidArgument(id + ": unexpected message '" +
                          codedOpName(static_cast<uint8_t>(job.op)) + "' from the master");
    }
    if (!s.ok()) {
      result = s;
      break;
    }
  }
  conn_->close();
  ctx_->join();
  return result;
}

}  // namespace

Status runCodedWorker(const CodedWorkerOptions& options) {
  Worker w(options);
  return w.run();
}

}  // namespace cofab::coded
