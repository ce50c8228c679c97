#include "fabric/transport/tcp/epoll_loop.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

#include "core/log.h"

namespace cofab::transport::tcp {

StatusOr<std::unique_ptr<EpollLoop>> EpollLoop::start(const std::string& name) {
  std::unique_ptr<EpollLoop> loop(new EpollLoop());
  loop->epoll_ = Fd(::epoll_create1(EPOLL_CLOEXEC));
  if (!loop->epoll_.valid()) return errnoStatus(StatusCode::kIoError, "epoll_create1", errno);
  loop->event_ = Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!loop->event_.valid()) return errnoStatus(StatusCode::kIoError, "eventfd", errno);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;  // null marks the wake-up eventfd
  if (::epoll_ctl(loop->epoll_.get(), EPOLL_CTL_ADD, loop->event_.get(), &ev) != 0) {
    return errnoStatus(StatusCode::kIoError, "epoll_ctl(ADD eventfd)", errno);
  }
  EpollLoop* raw = loop.get();
  loop->thread_ = std::thread([raw, name] {
    pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
    raw->run();
  });
  loop->threadId_.store(loop->thread_.get_id());
  return loop;
}

EpollLoop::~EpollLoop() {
  stop();
  join();
}

Status EpollLoop::add(int fd, uint32_t events, std::shared_ptr<EpollHandler> handler) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = handler.get();
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
    return errnoStatus(StatusCode::kIoError, "epoll_ctl(ADD)", errno);
  }
  handlers_[fd] = std::move(handler);
  return OkStatus();
}

void EpollLoop::remove(int fd) {
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
  auto it = handlers_.find(fd);
  if (it != handlers_.end()) {
    graveyard_.push_back(std::move(it->second));
    handlers_.erase(it);
  }
}

void EpollLoop::wake() {
  // Work posted from the loop's own thread (callbacks chaining the next operation) is picked up
  // by the drain at the end of the current iteration: no eventfd round trip.
  if (inLoopThread()) return;
  if (!wakePending_.exchange(true, std::memory_order_acq_rel)) {
    const uint64_t one = 1;
    // EAGAIN means the counter is already non-zero: the loop will wake anyway.
    [[maybe_unused]] ssize_t n = ::write(event_.get(), &one, sizeof(one));
  }
}

bool EpollLoop::post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return false;
    tasks_.push_back(std::move(fn));
  }
  wake();
  return true;
}

bool EpollLoop::schedule(std::shared_ptr<Schedulable> item) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return false;
    ready_.push_back(std::move(item));
  }
  wake();
  return true;
}

void EpollLoop::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wakePending_.store(false);
  wake();
}

void EpollLoop::join() {
  if (!thread_.joinable()) return;
  COFAB_CHECK(!inLoopThread()) << "a tcp context was destroyed or joined from one of its own "
                                   "I/O threads (inside a transport callback)";
  thread_.join();
}

void EpollLoop::run() {
  constexpr int kMaxEvents = 64;
  epoll_event events[kMaxEvents];
  std::vector<std::function<void()>> tasks;
  std::vector<std::shared_ptr<Schedulable>> ready;
  int timeout = -1;
  while (true) {
    const int n = ::epoll_wait(epoll_.get(), events, kMaxEvents, timeout);
    timeout = -1;
    if (n < 0 && errno != EINTR) {
      COFAB_LOG(kError, "tcp") << "epoll_wait failed: errno " << errno << "; loop exits";
      break;
    }
    for (int i = 0; i < n; ++i) {
      if (events[i].data.ptr == nullptr) {
        uint64_t v;
        [[maybe_unused]] ssize_t r = ::read(event_.get(), &v, sizeof(v));
        continue;
      }
      static_cast<EpollHandler*>(events[i].data.ptr)->handleEvents(events[i].events);
    }
    bool exit = false;
    // Drain until empty: work queued by the work itself (callbacks posting new operations)
    // runs in this iteration, without another trip through epoll_wait.
    for (int round = 0;; ++round) {
      if (round == 64) {
        // Keep I/O events flowing under a flood of self-posted work: poll, then drain again.
        timeout = 0;
        break;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        wakePending_.store(false, std::memory_order_release);
        tasks.swap(tasks_);
        ready.swap(ready_);
        if (tasks.empty() && ready.empty()) {
          if (stopping_) {
            stopped_ = true;
            exit = true;
          }
          break;
        }
      }
      for (auto& t : tasks) t();
      tasks.clear();
      for (auto& r : ready) r->runScheduled();
      ready.clear();
    }
    graveyard_.clear();
    if (exit) break;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
  }
  handlers_.clear();
  graveyard_.clear();
}

}  // namespace cofab::transport::tcp
