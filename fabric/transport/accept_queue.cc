#include "fabric/transport/accept_queue.h"

#include <thread>

namespace cofab::transport {

AcceptQueue::AcceptQueue(std::string address, Post post)
    : address_(std::move(address)), post_(std::move(post)) {}

void AcceptQueue::deliver(std::shared_ptr<Connection> conn) {
  AcceptCallback waiter;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!closed_ && waiters_.empty()) {
      ready_.push_back(std::move(conn));
      cv_.notify_one();
      return;
    }
    if (!closed_) {
      waiter = std::move(waiters_.front());
      waiters_.pop_front();
    }
  }
  if (!waiter) {
    conn->close();
    return;
  }
  complete(std::make_shared<AcceptCallback>(std::move(waiter)), OkStatus(), std::move(conn));
}

StatusOr<std::shared_ptr<Connection>> AcceptQueue::accept(Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  while (ready_.empty() && !closed_) {
    if (deadline.isNever()) {
      cv_.wait(lock);
    } else if (cv_.wait_until(lock, deadline.when()) == std::cv_status::timeout) {
      break;
    }
  }
  if (!ready_.empty()) {
    auto c = std::move(ready_.front());
    ready_.pop_front();
    return c;
  }
  if (closed_) return Cancelled("listener " + address_ + " is closed");
  return DeadlineExceeded("listener " + address_ + ": no connection arrived by the deadline");
}

void AcceptQueue::acceptAsync(AcceptCallback done) {
  std::shared_ptr<Connection> conn;
  Status status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ready_.empty()) {
      conn = std::move(ready_.front());
      ready_.pop_front();
    } else if (closed_) {
      status = Cancelled("listener " + address_ + " is closed");
    } else {
      waiters_.push_back(std::move(done));
      return;
    }
  }
  complete(std::make_shared<AcceptCallback>(std::move(done)), status, std::move(conn));
}

void AcceptQueue::complete(std::shared_ptr<AcceptCallback> cb, Status status,
                           std::shared_ptr<Connection> conn) {
  if (post_([cb, status, conn] { (*cb)(status, conn); })) return;
  if (conn) conn->close();
  std::thread([cb, addr = address_] {
    (*cb)(Cancelled("listener " + addr + ": the transport context is closed"), nullptr);
  }).detach();
}

bool AcceptQueue::close() {
  std::deque<AcceptCallback> waiters;
  std::deque<std::shared_ptr<Connection>> ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return false;
    closed_ = true;
    waiters.swap(waiters_);
    ready.swap(ready_);
    cv_.notify_all();
  }
  for (auto& c : ready) c->close();
  for (auto& w : waiters) {
    complete(std::make_shared<AcceptCallback>(std::move(w)),
             Cancelled("listener " + address_ + " was closed"), nullptr);
  }
  return true;
}

bool AcceptQueue::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

}  // namespace cofab::transport
