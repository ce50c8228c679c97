// EpollLoop: one I/O thread running epoll_wait, owned by a tcp context.
//
// Handlers (connections, listeners) register a file descriptor and get their events on the loop
// thread. Other threads hand work to the loop two ways: post() runs a closure (rare paths:
// setup, close), schedule() marks a Schedulable ready so that its runScheduled() runs once on
// the next iteration (the per-operation hot path: no allocation once the ready list has grown,
// at most one eventfd write per loop iteration however many operations are posted).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "fabric/transport/tcp/socket_util.h"

namespace cofab::transport::tcp {

class EpollHandler {
 public:
  virtual ~EpollHandler() = default;
  virtual void handleEvents(uint32_t events) = 0;
};

class Schedulable {
 public:
  virtual ~Schedulable() = default;
  virtual void runScheduled() = 0;
};

class EpollLoop {
 public:
  static StatusOr<std::unique_ptr<EpollLoop>> start(const std::string& name);
  ~EpollLoop();  // stop() + join()

  // Loop thread only. The loop keeps `handler` alive while registered and until the end of the
  // iteration in which it is removed (events already fetched may still name it).
  Status add(int fd, uint32_t events, std::shared_ptr<EpollHandler> handler);
  void remove(int fd);

  // Any thread. False when the loop has stopped: `fn` was not queued and will never run.
  bool post(std::function<void()> fn);
  bool schedule(std::shared_ptr<Schedulable> item);

  bool inLoopThread() const { return std::this_thread::get_id() == threadId_.load(); }
  // Asks the thread to exit once the queued work has run. Any thread.
  void stop();
  // Waits for the thread (not from the loop thread itself).
  void join();

 private:
  EpollLoop() = default;
  void run();
  void wake();

  Fd epoll_;
  Fd event_;
  std::thread thread_;
  std::atomic<std::thread::id> threadId_{};

  std::mutex mu_;
  bool stopping_ = false;  // under mu_
  bool stopped_ = false;   // under mu_: post/schedule refuse work
  std::vector<std::function<void()>> tasks_;
  std::vector<std::shared_ptr<Schedulable>> ready_;
  std::atomic<bool> wakePending_{false};

  // Loop thread only.
  std::unordered_map<int, std::shared_ptr<EpollHandler>> handlers_;
  std::vector<std::shared_ptr<EpollHandler>> graveyard_;
};

}  // namespace cofab::transport::tcp
