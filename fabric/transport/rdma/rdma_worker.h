// Worker: an rdma context's completion-queue thread. It runs posted tasks (every operation on a
// connection, so connection state is touched only here) and polls the completion queues of the
// endpoints it serves, backing off from busy polling to short sleeps when nothing happens.
// Internal to fabric/transport/rdma.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "fabric/transport/off_loop_runner.h"

namespace cofab::transport::rdma {

// What the worker polls. poll() returns whether it made progress; finished() once the endpoint
// has released its verbs resources and can be dropped from the list.
class Pollable {
 public:
  virtual ~Pollable() = default;
  virtual bool poll() = 0;
  virtual bool finished() const = 0;
  // The context is stopping: start closing (called on the worker thread).
  virtual void shutdown() = 0;
};

class Worker {
 public:
  Worker();
  ~Worker();  // stop() + join()

  // False once the thread has exited (the task will never run).
  bool post(std::function<void()> fn);
  // Runs `fn` on the worker, or once the worker is gone on its OffLoopRunner (one short-lived
  // thread at a time, in posting order), so a completion is never run inline by the caller and
  // completions stay serial and ordered after join too.
  void postOrDetach(std::function<void()> fn);
  // Polls `p` from now on (until it reports finished()).
  bool add(std::shared_ptr<Pollable> p);
  // Shuts every endpoint down and exits once they have finished.
  void stop();
  void join();
  // Runs on the worker thread after its last task, before it exits (the context closes its side
  // channels there, once every goodbye is out). Set before stop().
  void setExitHook(std::function<void()> hook);
  bool inWorkerThread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool exited_ = false;
  std::deque<std::function<void()>> tasks_;
  std::function<void()> exitHook_;
  std::vector<std::shared_ptr<Pollable>> pollables_;  // worker thread only
  bool shutDown_ = false;  // worker thread only: stop()'s shutdown task has run
  std::thread thread_;
  const std::shared_ptr<OffLoopRunner> offLoop_ = std::make_shared<OffLoopRunner>();
};

}  // namespace cofab::transport::rdma
