// CodedMaster: the master of the coded task service. It places A, as n blocks, on n worker
// processes (fabric/coded/coded_worker.h) once; each multiply(B) sends B to every live worker,
// takes the first results that suffice, cancels the rest and assembles C = A x B.
//
//   kCoded       A encoded by coding::CodedMatmul into n blocks, any k of which suffice (decode
//                as the local CodedMatmul does, so results equal the local ones). For C(n, k)
//                past RealMdsCode's exhaustiveLimit only a sample of patterns was checked: the
//                first k results that arrive are decoded, and an ill-conditioned pattern the
//                sample missed fails the request with DataLoss (not retried with other results)
//   kUncoded     A split into n row blocks, every worker needed (k = n)
//   kReplicated  A split into n / r row blocks, worker w holds block w mod (n / r): every block
//                needs one of its r copies
//
// A worker whose connection fails (killed, crashed) is dead for good: a permanent straggler.
// multiply() fails fast with FailedPrecondition naming the dead workers when the live ones
// cannot suffice before it starts, with Unavailable when workers die or report task errors
// during the request until the rest cannot suffice, and with DeadlineExceeded naming the workers
// that did not answer when the request deadline passes (a stopped worker). A block of A, a B or
// a result too big for one message (coded_protocol.h: checkMatrixMessage) is InvalidArgument
// before anything is sent. Transport: fabric/transport directly (not the
// Communicator, whose first failure is sticky for the whole group), one connection per worker.
//
// Threads: create(), load(), multiply() and the accessors from one thread at a time (the
// owner's); the transport's I/O threads deliver messages into the master's state under its
// mutex. The destructor tells the workers to shut down and joins the I/O threads. The Store is
// borrowed for create() only.
#pragma once

#include <cstdint>
#include <map>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "coding/matmul/coded_matmul.h"
#include "core/clock.h"
#include "core/status.h"
#include "fabric/coded/coded_protocol.h"
#include "fabric/rendezvous/store.h"
#include "fabric/transport/context.h"

namespace cofab::coded {

enum class CodedMode : uint8_t { kCoded, kUncoded, kReplicated };
const char* codedModeName(CodedMode mode);
StatusOr<CodedMode> parseCodedMode(const std::string& name);

struct CodedServiceOptions {
  CodedMode mode = CodedMode::kCoded;
  int n = 0;         // workers
  int k = 0;         // kCoded: results needed, 1 <= k < n
  int replicas = 2;  // kReplicated: copies of each block, divides n
  coding::MdsFamily family = coding::MdsFamily::kRandomGaussian;  // kCoded
  uint64_t codeSeed = 1;
  // kCoded: the largest condition number of a decode the service accepts (coding's
  // RealMdsOptions::maxCondition). The relative error of decoded blocks is about that times f32
  // rounding (docs/CODING.md): lower it for tighter results. create() refuses a code whose
  // surveyed worst case exceeds it; a request whose pattern does (only when the survey sampled,
  // large n) fails with DataLoss instead of returning an inaccurate C.
  double maxCondition = 1e6;
  // Worker-side injected delay, load x (shift + Exp(tail)) per task (coding's
  // ShiftedExponentialDelay, drawn from (request, worker)); both 0: none.
  double shiftMs = 0;
  double tailMeanMs = 0;
  uint64_t delaySeed = 1;
  // false: the injected delay is shift + Exp(tail) whatever the task's size (straggling of the
  // environment: OS noise, contention, the network), not load x (...) (straggling of the work).
  // The computation itself scales with the load either way.
  bool loadScaledDelay = true;
  // Artificial extra time per row block on some workers (slow workers; tests of cancellation).
  std::map<int, double> rowBlockDelayMs;
  int64_t rowBlock = 16;             // rows between cancellation checks on the workers
  std::string name = "cofab-coded";  // store key prefix; several services need distinct names
  std::string transport = "tcp";
  std::string listenAddress;  // empty: the transport's default
  // Where the master encodes A's parity and decodes (kCoded): "cpu" or "gpu" (CUDA device 0;
  // blocks staged there and copied back, workers always compute on their CPU). Empty:
  // COFAB_CODED_DEVICE (default cpu). "gpu" without a usable GPU makes create() fail with
  // Unavailable saying why; there is no silent CPU fallback.
  std::string device;
  Duration setupTimeout{0};    // 0: COFAB_CODED_SETUP_TIMEOUT_MS
  Duration requestTimeout{0};  // 0: COFAB_CODED_REQUEST_TIMEOUT_MS
};

struct RequestReport {
  uint64_t request = 0;
  std::vector<int> used;       // workers whose results built C, in arrival order
  std::vector<int> cancelled;  // live workers sent a cancel
  bool decoded = false;        // kCoded: parity results were decoded
  double condition = 0;        // kCoded, decoded: the solved system's condition number
  double completionMs = 0;     // from sending B until the last needed result arrived
  double decodeMs = 0;         // decode or block assembly
  double totalMs = 0;
};

struct CancelReport {
  int worker = -1;
  uint64_t request = 0;
  CancelStage stage = CancelStage::kQueued;
  int64_t rowBlocksDone = 0;
  int64_t rowBlocksTotal = 0;
};

class CodedMaster {
 public:
  // Listens, publishes the address in `store` under "<name>/master" and waits until all n
  // workers registered (DeadlineExceeded naming the missing ones otherwise).
  static StatusOr<std::unique_ptr<CodedMaster>> create(Store* store,
                                                       const CodedServiceOptions& options);
  ~CodedMaster();
  CodedMaster(const CodedMaster&) = delete;
  CodedMaster& operator=(const CodedMaster&) = delete;

  const CodedServiceOptions& options() const { return options_; }
  // Results needed per request: k, n or n / r.
  int needed() const;

  // Encodes (kCoded) or splits A and places one block on every live worker; returns once enough
  // of them acknowledged for a request to complete from those alone (any k in coded mode, one
  // replica per block group, every worker uncoded): a straggler does not hold it up, and gets
  // its block ahead of any request on its connection. A worker that dies meanwhile is marked
  // dead, not an error; DeadlineExceeded (setupTimeout) names the workers that did not ack. A
  // worker whose previous block is still unsent here and unacknowledged (it reads nothing) is
  // passed over and gets no request until a later load reaches it; Unavailable at once when
  // those passed over leave too few workers to complete a request, naming them.
  Status load(coding::ConstMatrixView a);

  // c (A.rows x B.cols) = A x B. See the header comment for the errors.
  StatusOr<RequestReport> multiply(coding::ConstMatrixView b, coding::MatrixView c);

  // Waits until cancel reports for `request` came from `workers`; returns what they said. The
  // master keeps the most recent few thousand reports. Unavailable naming them as soon as every
  // worker still missing is dead (their reports cannot come); DeadlineExceeded naming the others
  // at the deadline; InvalidArgument for a worker index outside [0, n).
  StatusOr<std::vector<CancelReport>> waitCancelReports(uint64_t request,
                                                        const std::vector<int>& workers,
                                                        Deadline deadline);

  // Dead workers with the reason ("worker 3: RemoteError: ...").
  std::map<int, std::string> deadWorkers() const;

  struct State;  // shared with the I/O callbacks

 private:
  explicit CodedMaster(const CodedServiceOptions& options);
  Status checkLive(const char* what) const;
  // Block groups: the workers w with the same w % blockGroups() hold the same block (replicated
  // mode); otherwise every worker is its own group.
  int blockGroups() const;
  // How many block groups have a worker w for which holds(w); under state_->mu.
  int coveredGroups(const std::function<bool(int)>& holds) const;

  CodedServiceOptions options_;
  std::optional<coding::CodedMatmul> code_;
  std::optional<coding::EncodedMatrix> encoded_;
  Device device_;  // options_.device resolved
  int64_t aRows_ = 0, aCols_ = 0, blockRows_ = 0;
  std::shared_ptr<transport::Context> ctx_;
  std::unique_ptr<transport::Listener> listener_;  // open while create() takes the workers
  std::shared_ptr<State> state_;
  uint64_t nextRequest_ = 1;
};

}  // namespace cofab::coded
