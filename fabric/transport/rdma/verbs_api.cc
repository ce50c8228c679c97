#include "fabric/transport/rdma/verbs_api.h"

#include <dlfcn.h>

#include <cerrno>
#include <cstring>
#include <mutex>

namespace cofab::transport::rdma {
namespace {

// The exported symbols, resolved once. ibv_query_port is a macro in verbs.h (it expands to the
// inline ___ibv_query_port); the symbol the library exports under that name takes the compat
// attribute struct, which the inline wrapper casts to (verbs.h, rdma-core 44).
struct Symbols {
  int (*queryPortCompat)(ibv_context*, uint8_t, _compat_ibv_port_attr*) = nullptr;
};
Symbols gSymbols;

// Mirrors verbs.h's ___ibv_query_port: the extended op when the provider has it (fills the
// newer fields such as link_layer), else the exported compat entry point on a zeroed struct.
int realQueryPort(ibv_context* context, uint8_t port, ibv_port_attr* attr) {
  verbs_context* vctx = verbs_get_ctx_op(context, query_port);
  if (vctx == nullptr) {
    std::memset(attr, 0, sizeof(*attr));
    return gSymbols.queryPortCompat(context, port, reinterpret_cast<_compat_ibv_port_attr*>(attr));
  }
  return vctx->query_port(context, port, attr, sizeof(*attr));
}

// The fast-path verbs are static inline in verbs.h (calls through context->ops); these
// out-of-line copies let them live in the table.
int realPostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  return ibv_post_send(qp, wr, bad);
}
int realPostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  return ibv_post_recv(qp, wr, bad);
}
int realPollCq(ibv_cq* cq, int n, ibv_wc* wc) { return ibv_poll_cq(cq, n, wc); }

struct Loaded {
  VerbsApi api;
  Status status;
};

template <typename Fn>
bool bind(void* lib, const char* name, Fn* out, std::string* missing) {
  dlerror();
  void* sym = dlsym(lib, name);
  if (sym == nullptr) {
    if (!missing->empty()) *missing += ", ";
    *missing += name;
    return false;
  }
  *out = reinterpret_cast<Fn>(sym);
  return true;
}

Loaded load() {
  Loaded l;
  // RTLD_LOCAL: the providers libibverbs loads must not see our symbols, nor we theirs.
  void* lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* e = dlerror();
    l.status = Unavailable(std::string("rdma: cannot load libibverbs.so.1 (rdma-core not "
                                       "installed?): ") +
                           (e ? e : "unknown dlopen error"));
    return l;
  }
  VerbsApi& a = l.api;
  a.binding = "libibverbs.so.1";
  std::string missing;
  bind(lib, "ibv_get_device_list", &a.getDeviceList, &missing);
  bind(lib, "ibv_free_device_list", &a.freeDeviceList, &missing);
  bind(lib, "ibv_get_device_name", &a.getDeviceName, &missing);
  bind(lib, "ibv_open_device", &a.openDevice, &missing);
  bind(lib, "ibv_close_device", &a.closeDevice, &missing);
  bind(lib, "ibv_query_port", &gSymbols.queryPortCompat, &missing);
  bind(lib, "ibv_query_gid", &a.queryGid, &missing);
  bind(lib, "ibv_alloc_pd", &a.allocPd, &missing);
  bind(lib, "ibv_dealloc_pd", &a.deallocPd, &missing);
  bind(lib, "ibv_reg_mr", &a.regMr, &missing);
  bind(lib, "ibv_dereg_mr", &a.deregMr, &missing);
  bind(lib, "ibv_create_cq", &a.createCq, &missing);
  bind(lib, "ibv_destroy_cq", &a.destroyCq, &missing);
  bind(lib, "ibv_create_qp", &a.createQp, &missing);
  bind(lib, "ibv_destroy_qp", &a.destroyQp, &missing);
  bind(lib, "ibv_modify_qp", &a.modifyQp, &missing);
  bind(lib, "ibv_wc_status_str", &a.wcStatusStr, &missing);
  if (!missing.empty()) {
    // The library stays loaded (handles are process-wide and cheap); nothing calls into it.
    l.status = Unavailable("rdma: libibverbs.so.1 lacks " + missing);
    return l;
  }
  a.queryPort = realQueryPort;
  a.postSend = realPostSend;
  a.postRecv = realPostRecv;
  a.pollCq = realPollCq;
  return l;
}

}  // namespace

StatusOr<const VerbsApi*> loadRealVerbs() {
  static std::once_flag once;
  static Loaded* loaded = nullptr;  // leaked on purpose: the library is never unloaded
  std::call_once(once, [] { loaded = new Loaded(load()); });
  if (!loaded->status.ok()) return loaded->status;
  return &loaded->api;
}

Status verbsError(StatusCode code, std::string_view call, int err, std::string_view peer) {
  std::string m(call);
  m += " failed: ";
  m += err != 0 ? std::strerror(err) : "unknown error (no errno)";
  m += " (errno " + std::to_string(err) + ")";
  if (!peer.empty()) m += " (peer " + std::string(peer) + ")";
  return Status(code, std::move(m));
}

StatusOr<DeviceListing> listDevices(const VerbsApi& verbs) {
  int n = 0;
  errno = 0;
  ibv_device** list = verbs.getDeviceList(&n);
  if (list == nullptr) {
    const int err = errno;
    // ibv_get_device_list(3): "Returns ... NULL on error"; errno ENOSYS when the kernel has no
    // RDMA support (no uverbs), which is what machines without a device report.
    return Unavailable("rdma: no RDMA device: ibv_get_device_list returned NULL (errno " +
                       std::to_string(err) + ": " + std::strerror(err) + ") via " +
                       verbs.binding);
  }
  DeviceListing out;
  for (int i = 0; i < n; ++i) out.names.emplace_back(verbs.getDeviceName(list[i]));
  verbs.freeDeviceList(list);
  if (out.names.empty()) {
    return Unavailable(std::string("rdma: no RDMA device: ibv_get_device_list found none via ") +
                       verbs.binding);
  }
  return out;
}

}  // namespace cofab::transport::rdma
