// RdmaConnection: the Connection users hold (contract: fabric/transport/connection.h). A thin
// handle over an Endpoint, which the context's worker also references while it polls it; the
// handle exists so that dropping the user's last reference closes the connection. Internal to
// fabric/transport/rdma. Thread-safe (every operation is posted to the worker).
#pragma once

#include <memory>
#include <string>

#include "fabric/transport/connection.h"
#include "fabric/transport/rdma/rdma_endpoint.h"

namespace cofab::transport::rdma {

class RdmaConnection : public Connection {
 public:
  explicit RdmaConnection(std::shared_ptr<Endpoint> ep) : ep_(std::move(ep)) {}
  ~RdmaConnection() override { ep_->close(); }

  using Connection::recv;
  using Connection::send;
  void send(const wire::Header& header, ConstSlices payload, SendCallback done) override {
    ep_->send(header, payload, std::move(done));
  }
  void recv(MutableSlices dest, RecvCallback done) override { ep_->recv(dest, std::move(done)); }
  void recvOwned(RecvOwnedCallback done) override { ep_->recvOwned(std::move(done)); }
  void close() override { ep_->close(); }
  Status status() const override { return ep_->status(); }
  const std::string& peerId() const override { return ep_->peerId(); }
  const std::string& peerAddress() const override { return ep_->peerAddress(); }
  std::string describe() const override { return ep_->describe(); }

 private:
  std::shared_ptr<Endpoint> ep_;
};

}  // namespace cofab::transport::rdma
