#include "fabric/bin/backend_probe.h"

#include <dlfcn.h>

#include <cerrno>
#include <cstring>

#include "core/config.h"
#include "gpu/device.h"


namespace cofab {
namespace {

// RDMA is probed the way the transport will load it: dlopen of libibverbs, so the report is
// true for binaries that do not link rdma-core. ibv_get_device_list may return NULL (errno 38
// on kernels without RDMA support) as well as an empty list.
BackendReport probeRdma() {
  BackendReport r{"rdma", COFAB_HAVE_RDMA != 0, false, ""};
  void* lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    r.detail = std::string("libibverbs.so.1 not loadable: ") + dlerror();
    return r;
  }
  using GetList = void** (*)(int*);
  using FreeList = void (*)(void**);
  using GetName = const char* (*)(void*);
  auto getList = reinterpret_cast<GetList>(dlsym(lib, "ibv_get_device_list"));
  auto freeList = reinterpret_cast<FreeList>(dlsym(lib, "ibv_free_device_list"));
  auto getName = reinterpret_cast<GetName>(dlsym(lib, "ibv_get_device_name"));
  if (!getList || !freeList || !getName) {
    r.detail = "libibverbs.so.1 lacks ibv_get_device_list/ibv_free_device_list/ibv_get_device_name";
    dlclose(lib);
    return r;
  }
  int n = 0;
  errno = 0;
  void** list = getList(&n);
  if (list == nullptr) {
    int err = errno;
    r.detail = "no RDMA device: ibv_get_device_list returned NULL (errno " + std::to_string(err) +
               ": " + strerror(err) + ")";
  } else if (n == 0) {
    r.detail = "no RDMA device: ibv_get_device_list found none";
    freeList(list);
  } else {
    r.usable = true;
    r.detail = std::to_string(n) + " device(s):";
    for (int i = 0; i < n; ++i) r.detail += std::string(" ") + getName(list[i]);
    freeList(list);
  }
  dlclose(lib);
  if (!r.built) r.detail += " (but this cofab was built without RDMA support)";
  r.usable = r.usable && r.built;
  return r;
}

}  // namespace

std::vector<BackendReport> probeBackends() {
  std::vector<BackendReport> out;
  out.push_back({"isal", COFAB_HAVE_ISAL != 0, COFAB_HAVE_ISAL != 0,
                 COFAB_HAVE_ISAL ? "Intel ISA-L linked" : "built without ISA-L: portable codec"});
#if COFAB_HAVE_DPDK
  out.push_back({"dpdk", true, false,
                 std::string("DPDK ") + COFAB_DPDK_VERSION +
                     " linked; the dpdk transport is not implemented yet (issue 6)"});
#else
  out.push_back({"dpdk", false, false, "built without DPDK (COFAB_WITH_DPDK=OFF or not found)"});
#endif
  out.push_back(probeRdma());
  auto gpus = gpu::deviceCount();
  out.push_back({"cuda", COFAB_HAVE_CUDA != 0, gpus.ok(), gpu::describeDevices()});
  return out;
}

}  // namespace cofab
