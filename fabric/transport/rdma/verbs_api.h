// VerbsApi: the narrow table of libibverbs entry points the rdma transport uses, and nothing
// else. The transport never calls a verbs function directly: every call goes through a table,
// so that
//   - binaries never link libibverbs (the real table is filled by dlopen("libibverbs.so.1") at
//     run time, the way NCCL and tensorpipe reach it) and start on machines without rdma-core;
//   - tests can bind the table to an in-process emulation (tests/support/verbs_emulation.h).
// The fast-path verbs (post_send, post_recv, poll_cq) are static inline in <infiniband/verbs.h>
// (they call through context->ops); the real table holds small functions that call those inline
// wrappers, so an emulation can replace them like any other entry.
//
// Tables are immutable once built and may be used from any thread. loadRealVerbs() loads the
// library once per process (a once-guard, never a static initialiser) and keeps it loaded.
#pragma once

#include <infiniband/verbs.h>

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace cofab::transport::rdma {

struct VerbsApi {
  // Human-readable name of the binding ("libibverbs.so.1", "verbs emulation (test double)").
  const char* binding = "";

  ibv_device** (*getDeviceList)(int* numDevices) = nullptr;
  void (*freeDeviceList)(ibv_device** list) = nullptr;
  const char* (*getDeviceName)(ibv_device* device) = nullptr;
  ibv_context* (*openDevice)(ibv_device* device) = nullptr;
  int (*closeDevice)(ibv_context* context) = nullptr;
  // The full ibv_port_attr (the real binding goes through the extended query_port op when the
  // provider has it, else the exported compat symbol, exactly as verbs.h's ___ibv_query_port).
  int (*queryPort)(ibv_context* context, uint8_t port, ibv_port_attr* attr) = nullptr;
  int (*queryGid)(ibv_context* context, uint8_t port, int index, ibv_gid* gid) = nullptr;
  ibv_pd* (*allocPd)(ibv_context* context) = nullptr;
  int (*deallocPd)(ibv_pd* pd) = nullptr;
  ibv_mr* (*regMr)(ibv_pd* pd, void* addr, size_t length, int access) = nullptr;
  int (*deregMr)(ibv_mr* mr) = nullptr;
  ibv_cq* (*createCq)(ibv_context* context, int cqe, void* cqContext, ibv_comp_channel* channel,
                      int compVector) = nullptr;
  int (*destroyCq)(ibv_cq* cq) = nullptr;
  ibv_qp* (*createQp)(ibv_pd* pd, ibv_qp_init_attr* attr) = nullptr;
  int (*destroyQp)(ibv_qp* qp) = nullptr;
  int (*modifyQp)(ibv_qp* qp, ibv_qp_attr* attr, int attrMask) = nullptr;
  int (*postSend)(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** badWr) = nullptr;
  int (*postRecv)(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** badWr) = nullptr;
  int (*pollCq)(ibv_cq* cq, int numEntries, ibv_wc* wc) = nullptr;
  const char* (*wcStatusStr)(ibv_wc_status status) = nullptr;
};

// The table bound to the system's libibverbs.so.1, loaded on first use. Unavailable naming the
// dlopen/dlsym error when rdma-core is not installed or lacks a symbol.
StatusOr<const VerbsApi*> loadRealVerbs();

// "ibv_modify_qp(INIT->RTR) failed: Invalid argument (errno 22) (peer 'rank 3')": a verbs call
// that reports failure through an errno-style return value or errno.
Status verbsError(StatusCode code, std::string_view call, int err, std::string_view peer = {});

// Unavailable with the reason when `verbs` sees no usable device: a NULL list with errno (38,
// ENOSYS, on kernels without RDMA support) or an empty list. On success lists the device names.
struct DeviceListing {
  std::vector<std::string> names;
};
StatusOr<DeviceListing> listDevices(const VerbsApi& verbs);

}  // namespace cofab::transport::rdma
