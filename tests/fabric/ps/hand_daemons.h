// A PushPullClient connected to daemons played by hand: tcp listeners of one transport
// context, each accepted connection handed to the test, which answers pushes itself.
#pragma once

#include <future>
#include <memory>
#include <vector>

#include "core/status.h"
#include "fabric/ps/push_pull.h"
#include "fabric/transport/registry.h"

namespace cofab::ps::testing {

struct HandDaemons {
  std::shared_ptr<transport::Context> ctx;
  std::vector<std::shared_ptr<transport::Connection>> daemons;
  std::unique_ptr<PushPullClient> client;

  HandDaemons() = default;
  HandDaemons(const HandDaemons&) = delete;
  HandDaemons& operator=(const HandDaemons&) = delete;
  ~HandDaemons() {
    if (client) client->close();
    if (ctx) {
      ctx->close();
      ctx->join();
    }
  }

  // `n` daemons; `options.serverAddresses` is filled in. `onAccepted` runs once every daemon
  // has accepted, before connect() must return (a credit grant goes there).
  Status start(int n, ClientOptions options,
               const std::function<void(HandDaemons&)>& onAccepted = {}) {
    COFAB_ASSIGN_OR_RETURN(ctx, transport::Registry::create("tcp", {}));
    std::vector<std::unique_ptr<transport::Listener>> listeners;
    for (int i = 0; i < n; ++i) {
      COFAB_ASSIGN_OR_RETURN(auto l, ctx->listen({}));
      options.serverAddresses.push_back(l->address());
      listeners.push_back(std::move(l));
    }
    auto connecting = std::async(std::launch::async,
                                 [&] { return PushPullClient::connect(0, 1, options); });
    for (auto& l : listeners) {
      COFAB_ASSIGN_OR_RETURN(auto a, l->accept(Deadline::afterMs(10000)));
      daemons.push_back(std::move(a));
    }
    if (onAccepted) onAccepted(*this);
    COFAB_ASSIGN_OR_RETURN(client, connecting.get());
    return OkStatus();
  }
};

}  // namespace cofab::ps::testing
