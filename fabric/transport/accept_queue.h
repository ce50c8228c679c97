// AcceptQueue: the part of a Listener every backend shares — connections that finished their
// handshake wait here for accept() / acceptAsync(), and close() fails the waiters.
//
// Thread-safe. Asynchronous waiters are completed through the backend's `post` function (so
// never inline from acceptAsync()); when `post` refuses (the backend's threads have stopped) a
// short-lived thread completes them instead.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "fabric/transport/listener.h"

namespace cofab::transport {

class AcceptQueue {
 public:
  // Runs a task on one of the backend's I/O threads; false if they have stopped.
  using Post = std::function<bool(std::function<void()>)>;
  AcceptQueue(std::string address, Post post);

  // Hands a new connection to the oldest waiter, or queues it. Closes it if the queue is closed.
  void deliver(std::shared_ptr<Connection> conn);
  StatusOr<std::shared_ptr<Connection>> accept(Deadline deadline);
  void acceptAsync(AcceptCallback done);
  // Fails waiters with Cancelled and closes queued connections. Idempotent; returns whether
  // this call closed it.
  bool close();
  bool closed() const;

 private:
  void complete(std::shared_ptr<AcceptCallback> cb, Status status,
                std::shared_ptr<Connection> conn);

  const std::string address_;
  Post post_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;
  std::deque<std::shared_ptr<Connection>> ready_;
  std::deque<AcceptCallback> waiters_;
};

}  // namespace cofab::transport
