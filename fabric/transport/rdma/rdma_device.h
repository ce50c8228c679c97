// RdmaDevice: one opened verbs device with its protection domain, the chosen port and GID —
// what every QP, CQ and memory region of one rdma context is created against.
//
// Chosen by parameters (COFAB_IB_DEVICE, COFAB_IB_PORT, COFAB_IB_GID_INDEX; fields of
// DeviceOptions win over them). Owned by the context through shared_ptr; connections and memory
// regions hold a reference, so the PD and device context outlive every object created on them.
// Immutable after open(); any thread may use it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "fabric/transport/rdma/verbs_api.h"

namespace cofab::transport::rdma {

struct DeviceOptions {
  std::string device;  // empty: COFAB_IB_DEVICE, else the first device listed
  int port = 0;        // 0: COFAB_IB_PORT
  int gidIndex = -1;   // -1: COFAB_IB_GID_INDEX
};

class RdmaDevice {
 public:
  // Unavailable when there is no device (with the reason), InvalidArgument for a named device,
  // port or GID index that does not exist, IoError for a failed verbs call.
  static StatusOr<std::shared_ptr<RdmaDevice>> open(const VerbsApi& verbs,
                                                    const DeviceOptions& options);
  ~RdmaDevice();
  RdmaDevice(const RdmaDevice&) = delete;
  RdmaDevice& operator=(const RdmaDevice&) = delete;

  const VerbsApi& verbs() const { return verbs_; }
  ibv_context* context() const { return context_; }
  ibv_pd* pd() const { return pd_; }
  const std::string& name() const { return name_; }
  uint8_t port() const { return port_; }
  int gidIndex() const { return gidIndex_; }
  const ibv_gid& gid() const { return gid_; }
  uint16_t lid() const { return lid_; }
  ibv_mtu activeMtu() const { return mtu_; }
  // True on Ethernet ports (RoCE): addressing is by GID only, the LID is meaningless.
  bool isEthernet() const { return ethernet_; }
  // "mlx5_0 port 1 gid[3]" for messages.
  std::string describe() const;

 private:
  explicit RdmaDevice(const VerbsApi& verbs) : verbs_(verbs) {}

  const VerbsApi& verbs_;
  ibv_context* context_ = nullptr;
  ibv_pd* pd_ = nullptr;
  std::string name_;
  uint8_t port_ = 1;
  int gidIndex_ = 0;
  ibv_gid gid_{};
  uint16_t lid_ = 0;
  ibv_mtu mtu_ = IBV_MTU_1024;
  bool ethernet_ = false;
};

// "00:00:...:01" of a GID, for messages.
std::string gidToString(const ibv_gid& gid);

}  // namespace cofab::transport::rdma
