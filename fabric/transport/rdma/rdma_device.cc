#include "fabric/transport/rdma/rdma_device.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/param.h"

namespace cofab::transport::rdma {
namespace {

COFAB_PARAM_STRING(kIbDevice, "COFAB_IB_DEVICE", "",
                   "rdma: verbs device to use (ibv_devices name); empty: the first one");
COFAB_PARAM_INT(kIbPort, "COFAB_IB_PORT", 1, 1, 255, "rdma: port number of the verbs device");
COFAB_PARAM_INT(kIbGidIndex, "COFAB_IB_GID_INDEX", 0, 0, 255,
                "rdma: GID table index (RoCE: pick the RoCE v2 IPv4 entry, see docs/RDMA.md)");

}  // namespace

std::string gidToString(const ibv_gid& gid) {
  std::string s;
  char b[4];
  for (int i = 0; i < 16; ++i) {
    std::snprintf(b, sizeof(b), "%02x", gid.raw[i]);
    if (i > 0 && i % 2 == 0) s += ':';
    s += b;
  }
  return s;
}

StatusOr<std::shared_ptr<RdmaDevice>> RdmaDevice::open(const VerbsApi& verbs,
                                                      const DeviceOptions& options) {
  std::string wanted = options.device;
  if (wanted.empty()) {
    COFAB_ASSIGN_OR_RETURN(wanted, kIbDevice.get());
  }
  int64_t port = options.port;
  if (port == 0) {
    COFAB_ASSIGN_OR_RETURN(port, kIbPort.get());
  }
  int64_t gidIndex = options.gidIndex;
  if (gidIndex < 0) {
    COFAB_ASSIGN_OR_RETURN(gidIndex, kIbGidIndex.get());
  }

  std::shared_ptr<RdmaDevice> dev(new RdmaDevice(verbs));
  int n = 0;
  errno = 0;
  ibv_device** list = verbs.getDeviceList(&n);
  if (list == nullptr) {
    const int err = errno;
    return Unavailable("rdma: no RDMA device: ibv_get_device_list returned NULL (errno " +
                       std::to_string(err) + ": " + std::strerror(err) + ") via " +
                       verbs.binding);
  }
  ibv_device* chosen = nullptr;
  std::string names;
  for (int i = 0; i < n; ++i) {
    const std::string name = verbs.getDeviceName(list[i]);
    names += (names.empty() ? "" : ", ") + name;
    if (chosen == nullptr && (wanted.empty() || wanted == name)) chosen = list[i];
  }
  if (chosen == nullptr) {
    verbs.freeDeviceList(list);
    if (n == 0) {
      return Unavailable(std::string("rdma: no RDMA device: ibv_get_device_list found none via ") +
                         verbs.binding);
    }
    return InvalidArgument("rdma: COFAB_IB_DEVICE='" + wanted + "' not found (devices: " + names +
                           ")");
  }
  dev->name_ = verbs.getDeviceName(chosen);
  errno = 0;
  dev->context_ = verbs.openDevice(chosen);
  const int openErr = errno;
  // ibv_free_device_list(3): devices already opened stay valid after the list is freed.
  verbs.freeDeviceList(list);
  if (dev->context_ == nullptr) {
    return verbsError(StatusCode::kUnavailable, "ibv_open_device(" + dev->name_ + ")", openErr);
  }
  dev->port_ = static_cast<uint8_t>(port);
  ibv_port_attr pa{};
  if (int rc = verbs.queryPort(dev->context_, dev->port_, &pa); rc != 0) {
    // ibv_query_port(3): returns 0 on success, or the value of errno on failure.
    return verbsError(StatusCode::kInvalidArgument,
                      "ibv_query_port(" + dev->name_ + ", port " + std::to_string(port) + ")",
                      rc);
  }
  if (pa.state != IBV_PORT_ACTIVE) {
    return Unavailable("rdma: " + dev->name_ + " port " + std::to_string(port) +
                       " is not active (state " + std::to_string(pa.state) +
                       "; ibv_devinfo shows PORT_ACTIVE on a usable port)");
  }
  dev->lid_ = pa.lid;
  dev->mtu_ = pa.active_mtu;
  dev->ethernet_ = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
  if (gidIndex >= pa.gid_tbl_len) {
    return InvalidArgument("rdma: COFAB_IB_GID_INDEX=" + std::to_string(gidIndex) + " but " +
                           dev->name_ + " port " + std::to_string(port) + " has " +
                           std::to_string(pa.gid_tbl_len) + " GID entries");
  }
  dev->gidIndex_ = static_cast<int>(gidIndex);
  if (int rc = verbs.queryGid(dev->context_, dev->port_, dev->gidIndex_, &dev->gid_); rc != 0) {
    // ibv_query_gid(3): returns 0 on success, -1 on error (errno is not reliably set).
    return verbsError(StatusCode::kInvalidArgument,
                      "ibv_query_gid(" + dev->name_ + ", index " + std::to_string(gidIndex) + ")",
                      errno);
  }
  static const ibv_gid kZeroGid{};
  if (dev->ethernet_ && std::memcmp(&dev->gid_, &kZeroGid, sizeof(ibv_gid)) == 0) {
    // RoCE GID tables are sparse: an unpopulated entry reads as zeros and cannot address anyone.
    return InvalidArgument("rdma: " + dev->name_ + " port " + std::to_string(port) +
                           " GID index " + std::to_string(gidIndex) +
                           " is empty (RoCE: pick a populated RoCE v2 entry, see `show_gids`)");
  }
  errno = 0;
  dev->pd_ = verbs.allocPd(dev->context_);
  if (dev->pd_ == nullptr) {
    return verbsError(StatusCode::kIoError, "ibv_alloc_pd(" + dev->name_ + ")", errno);
  }
  return dev;
}

RdmaDevice::~RdmaDevice() {
  // Teardown order of ibv_dealloc_pd(3) / ibv_close_device(3): resources before the context.
  if (pd_ != nullptr) verbs_.deallocPd(pd_);
  if (context_ != nullptr) verbs_.closeDevice(context_);
}

std::string RdmaDevice::describe() const {
  return name_ + " port " + std::to_string(port_) + " gid[" + std::to_string(gidIndex_) + "] " +
         gidToString(gid_);
}

}  // namespace cofab::transport::rdma
