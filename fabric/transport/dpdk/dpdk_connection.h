// DpdkConnection: the application's handle on a dpdk connection (contract:
// fabric/transport/connection.h). Internal to fabric/transport/dpdk.
//
// Every operation becomes a command that the engine's poller runs against the Conn, so the
// callbacks run on the poller and never inline. Once the poller has stopped (context joined),
// operations complete on a short-lived thread with the connection's sticky error.
#pragma once

#include <memory>
#include <string>

#include "fabric/transport/connection.h"
#include "fabric/transport/dpdk/conn.h"
#include "fabric/transport/dpdk/engine.h"
#include "fabric/transport/off_loop_runner.h"

namespace cofab::transport::dpdk {

class DpdkConnection final : public Connection {
 public:
  DpdkConnection(std::shared_ptr<Engine> engine, std::shared_ptr<Conn> conn)
      : engine_(std::move(engine)), conn_(std::move(conn)) {}
  ~DpdkConnection() override { close(); }

  using Connection::recv;
  using Connection::send;
  void send(const wire::Header& header, ConstSlices payload, SendCallback done) override;
  void recv(MutableSlices dest, RecvCallback done) override;
  void recvOwned(RecvOwnedCallback done) override;
  void recvRouted(RecvRoute route, RecvOwnedCallback done) override;
  void close() override;
  Status status() const override { return conn_->statusSnapshot(); }
  const std::string& peerId() const override { return conn_->peerName(); }
  const std::string& peerAddress() const override { return conn_->peerAddressText(); }
  std::string describe() const override { return conn_->describe(); }
  const Conn& conn() const { return *conn_; }

 private:
  // The status an operation gets when the poller is gone.
  Status stoppedStatus(const char* op) const;

  std::shared_ptr<Engine> engine_;
  std::shared_ptr<Conn> conn_;
  // Completions once the poller has stopped: never inline, one at a time, in posting order.
  const std::shared_ptr<OffLoopRunner> offLoop_ = std::make_shared<OffLoopRunner>();
};

}  // namespace cofab::transport::dpdk
