// LingeringClose: closes a tcp socket without throwing away what was already sent.
//
// close() on a socket whose receive queue holds bytes the application never read makes the
// kernel answer with a RST instead of a FIN, and a RST discards whatever is still in the send
// queue. A process that sends its last messages (an error reply, a Goodbye) and closes while
// the peer's messages sit unread would lose them, although send() completed OK. A lingering
// close sends the FIN after the queued bytes (shutdown(SHUT_WR)) and keeps the socket on the
// loop, reading and discarding the peer's input, until everything sent is acknowledged with
// nothing unread, the peer closes too, an error, or kLimit passes (a peer that stops reading
// cannot hold the descriptor forever). Internal to fabric/transport/tcp.
#pragma once

#include <chrono>
#include <memory>

#include "fabric/transport/tcp/epoll_loop.h"
#include "fabric/transport/tcp/socket_util.h"

namespace cofab::transport::tcp {

class LingeringClose final : public EpollHandler {
 public:
  static constexpr std::chrono::milliseconds kLimit{5000};
  // How often the send queue is checked while nothing arrives.
  static constexpr std::chrono::milliseconds kPollInterval{10};

  // Loop thread only. `fd` must no longer be registered with `loop`. Closes it at once when
  // nothing sent is unacknowledged, else keeps it on the loop until it can be closed cleanly.
  // If the loop stops first (its context closed and joined), a process-wide background thread
  // finishes the close the same way, within the same kLimit.
  static void start(EpollLoop& loop, Fd fd);

  ~LingeringClose() override;
  void handleEvents(uint32_t events) override;

 private:
  LingeringClose(EpollLoop& loop, Fd fd);
  // Reads and discards what has arrived; true when the peer closed or the socket failed.
  bool drainInput();
  // True when the kernel holds no unacknowledged byte of ours (the FIN included).
  bool allAcknowledged() const;
  void finish();

  EpollLoop& loop_;
  Fd fd_;
  Fd timer_;
  std::chrono::steady_clock::time_point deadline_;
  bool finished_ = false;
};

}  // namespace cofab::transport::tcp
