// For tests that play a daemon (or a worker) by hand on a transport Connection: take the next
// message with a bound on the wait.
#pragma once

#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <vector>

#include "core/status.h"
#include "fabric/transport/connection.h"
#include "fabric/wire/header.h"

namespace cofab::ps::testing {

struct Message {
  Status status;
  wire::Header header;
  std::vector<uint8_t> payload;
};

// One message from `conn`, or DeadlineExceeded after `timeoutMs`.
inline Message recvOne(transport::Connection& conn, int64_t timeoutMs) {
  auto done = std::make_shared<std::promise<Message>>();
  auto f = done->get_future();
  conn.recvOwned([done](const Status& s, const wire::Header& h, std::vector<uint8_t>&& p) {
    done->set_value(Message{s, h, std::move(p)});
  });
  if (f.wait_for(std::chrono::milliseconds(timeoutMs)) != std::future_status::ready) {
    return Message{DeadlineExceeded("no message"), {}, {}};
  }
  return f.get();
}

}  // namespace cofab::ps::testing
