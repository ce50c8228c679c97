// The real libibverbs binding, through the Registry: on a machine without an RDMA device (these
// development machines: no RDMA in the kernel, ibv_get_device_list returns NULL with errno 38)
// creating "rdma" must fail cleanly with Unavailable and the reason. Where a device exists the
// Unavailable case cannot be checked and the test skips, naming the devices.
#include <gtest/gtest.h>

#include "fabric/transport/rdma/verbs_api.h"
#include "fabric/transport/registry.h"

namespace cofab::transport::rdma {
namespace {

TEST(RdmaRealBindingTest, RegistryReportsUnavailableWithTheReasonWithoutADevice) {
  auto verbs = loadRealVerbs();
  if (verbs.ok()) {
    auto devices = listDevices(**verbs);
    if (devices.ok()) {
      std::string names;
      for (const auto& n : devices->names) names += " " + n;
      GTEST_SKIP() << "a real RDMA device exists (" << names
                   << "): the no-device path cannot be checked here";
    }
  }
  auto ctx = Registry::create("rdma");
  ASSERT_FALSE(ctx.ok()) << "rdma context created without a device?";
  EXPECT_EQ(ctx.status().code(), StatusCode::kUnavailable) << ctx.status();
  const std::string& m = ctx.status().message();
  if (verbs.ok()) {
    // NULL with an errno (38 = ENOSYS on these machines) or an empty list: both say "no RDMA
    // device" and how they were found out.
    EXPECT_NE(m.find("no RDMA device"), std::string::npos) << m;
    EXPECT_NE(m.find("ibv_get_device_list"), std::string::npos) << m;
    EXPECT_NE(m.find("libibverbs.so.1"), std::string::npos) << m;
  } else {
    EXPECT_NE(m.find("libibverbs"), std::string::npos) << m;
  }
}

TEST(RdmaRealBindingTest, RegistryListsRdma) {
  const auto names = Registry::names();
  EXPECT_NE(std::find(names.begin(), names.end(), "rdma"), names.end());
}

TEST(RdmaRealBindingTest, RealTableIsCompleteWhenLoadable) {
  auto verbs = loadRealVerbs();
  if (!verbs.ok()) GTEST_SKIP() << verbs.status();
  const VerbsApi& v = **verbs;
  EXPECT_STREQ(v.binding, "libibverbs.so.1");
  for (const void* p : {(const void*)v.getDeviceList, (const void*)v.freeDeviceList,
                        (const void*)v.getDeviceName, (const void*)v.openDevice,
                        (const void*)v.closeDevice, (const void*)v.queryPort,
                        (const void*)v.queryGid, (const void*)v.allocPd, (const void*)v.deallocPd,
                        (const void*)v.regMr, (const void*)v.deregMr, (const void*)v.createCq,
                        (const void*)v.destroyCq, (const void*)v.createQp, (const void*)v.destroyQp,
                        (const void*)v.modifyQp, (const void*)v.postSend, (const void*)v.postRecv,
                        (const void*)v.pollCq, (const void*)v.wcStatusStr}) {
    EXPECT_NE(p, nullptr);
  }
  // The status strings come from rdma-core itself.
  EXPECT_STREQ(v.wcStatusStr(IBV_WC_REM_ACCESS_ERR), "remote access error");
  EXPECT_STREQ(v.wcStatusStr(IBV_WC_RNR_RETRY_EXC_ERR), "RNR retry counter exceeded");
}

}  // namespace
}  // namespace cofab::transport::rdma
