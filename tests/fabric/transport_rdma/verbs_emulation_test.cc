// Tests of the verbs emulation itself (tests/support/verbs_emulation.h): the behaviours the rdma
// transport relies on must be modelled as the man pages say, or the transport tests over it
// would prove nothing.
#include "tests/support/verbs_emulation.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>

#include <cerrno>
#include <chrono>
#include <thread>
#include <vector>

#include "fabric/transport/rdma/factory.h"
#include "fabric/transport/rdma/rdma_device.h"

namespace cofab::testing {
namespace {

using transport::rdma::VerbsApi;

const VerbsApi& V() { return emulatedVerbs(); }

// One device context, PD and CQ per side, and an RC QP each.
struct Side {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  std::vector<uint8_t> buf = std::vector<uint8_t>(4096);
  ibv_mr* mr = nullptr;
};

class VerbsEmulationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setEmulatedDeviceCount(1);
    int n = 0;
    ibv_device** list = V().getDeviceList(&n);
    ASSERT_NE(list, nullptr);
    ASSERT_EQ(n, 1);
    for (Side* s : {&a_, &b_}) {
      s->ctx = V().openDevice(list[0]);
      s->pd = V().allocPd(s->ctx);
      s->cq = V().createCq(s->ctx, 64, nullptr, nullptr, 0);
      ibv_qp_init_attr qa{};
      qa.send_cq = s->cq;
      qa.recv_cq = s->cq;
      qa.qp_type = IBV_QPT_RC;
      qa.cap.max_send_wr = 16;
      qa.cap.max_recv_wr = 16;
      qa.cap.max_send_sge = 2;
      qa.cap.max_recv_sge = 2;
      s->qp = V().createQp(s->pd, &qa);
      ASSERT_NE(s->qp, nullptr);
      s->mr = V().regMr(s->pd, s->buf.data(), s->buf.size(),
                        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
      ASSERT_NE(s->mr, nullptr);
    }
    V().freeDeviceList(list);
  }
  void TearDown() override {
    for (Side* s : {&a_, &b_}) {
      if (s->qp) {
        EXPECT_EQ(V().destroyQp(s->qp), 0);
      }
      if (s->mr) {
        EXPECT_EQ(V().deregMr(s->mr), 0);
      }
      if (s->cq) {
        EXPECT_EQ(V().destroyCq(s->cq), 0);
      }
      if (s->pd) {
        EXPECT_EQ(V().deallocPd(s->pd), 0);
      }
      if (s->ctx) {
        EXPECT_EQ(V().closeDevice(s->ctx), 0);
      }
    }
  }

  static int toInit(ibv_qp* qp, int extraMask = 0, int dropMask = 0) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    return V().modifyQp(qp, &a,
                        (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS |
                         extraMask) & ~dropMask);
  }
  static int toRtr(ibv_qp* qp, uint32_t dest, int extraMask = 0, int dropMask = 0,
                   uint8_t minRnr = 12) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_4096;
    a.dest_qp_num = dest;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = minRnr;
    a.ah_attr.port_num = 1;
    return V().modifyQp(qp, &a,
                        (IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                         IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER |
                         extraMask) & ~dropMask);
  }
  static int toRts(ibv_qp* qp, uint8_t rnrRetry = 7, int dropMask = 0) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = rnrRetry;
    a.max_rd_atomic = 1;
    return V().modifyQp(qp, &a,
                        (IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                         IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC) & ~dropMask);
  }
  // Both QPs to RTS, connected to each other; the responder b gets `minRnr`.
  void connect(uint8_t rnrRetry = 7, uint8_t minRnr = 12) {
    ASSERT_EQ(toInit(a_.qp), 0);
    ASSERT_EQ(toInit(b_.qp), 0);
    ASSERT_EQ(toRtr(a_.qp, b_.qp->qp_num), 0);
    ASSERT_EQ(toRtr(b_.qp, a_.qp->qp_num, 0, 0, minRnr), 0);
    ASSERT_EQ(toRts(a_.qp, rnrRetry), 0);
    ASSERT_EQ(toRts(b_.qp, rnrRetry), 0);
  }
  static int postRecv(Side& s, uint64_t id, uint32_t offset, uint32_t len) {
    ibv_sge sge{reinterpret_cast<uint64_t>(s.buf.data() + offset), len, s.mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    return V().postRecv(s.qp, &wr, &bad);
  }
  static int post(Side& s, ibv_wr_opcode op, uint64_t id, uint32_t offset, uint32_t len,
                  uint64_t raddr, uint32_t rkey, uint32_t imm, bool signaled = true) {
    ibv_sge sge{reinterpret_cast<uint64_t>(s.buf.data() + offset), len, s.mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = op;
    wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
    wr.imm_data = htonl(imm);
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    ibv_send_wr* bad = nullptr;
    return V().postSend(s.qp, &wr, &bad);
  }
  // Polls until `n` completions arrived or 10 s passed (a bound for a test that must fail, not
  // a timing assertion).
  static std::vector<ibv_wc> pollN(ibv_cq* cq, size_t n) {
    std::vector<ibv_wc> out;
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (out.size() < n && std::chrono::steady_clock::now() < end) {
      ibv_wc wc[8];
      const int got = V().pollCq(cq, 8, wc);
      for (int i = 0; i < got; ++i) out.push_back(wc[i]);
      if (got == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return out;
  }
  uint64_t addrOf(Side& s, uint32_t off) { return reinterpret_cast<uint64_t>(s.buf.data() + off); }

  Side a_, b_;
};

TEST(VerbsEmulationDevicesTest, NullListWithEnosysAndEmptyList) {
  setEmulatedDeviceCount(-1);
  int n = 7;
  errno = 0;
  EXPECT_EQ(V().getDeviceList(&n), nullptr);
  EXPECT_EQ(errno, ENOSYS);
  auto r = transport::rdma::createContext({}, {.verbs = &V()});
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find("errno 38"), std::string::npos) << r.status();
  setEmulatedDeviceCount(0);
  ibv_device** list = V().getDeviceList(&n);
  ASSERT_NE(list, nullptr);
  EXPECT_EQ(n, 0);
  V().freeDeviceList(list);
  r = transport::rdma::createContext({}, {.verbs = &V()});
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find("found none"), std::string::npos) << r.status();
  setEmulatedDeviceCount(1);
}

TEST(VerbsEmulationDevicesTest, DeviceSelectionByNamePortAndGidIndex) {
  setEmulatedDeviceCount(2);
  auto dev = transport::rdma::RdmaDevice::open(V(), {.device = "emu1", .port = 1, .gidIndex = 2});
  ASSERT_TRUE(dev.ok()) << dev.status();
  EXPECT_EQ((*dev)->name(), "emu1");
  EXPECT_EQ((*dev)->gid().raw[14], 2);
  EXPECT_EQ(transport::rdma::RdmaDevice::open(V(), {.device = "mlx5_9"}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(transport::rdma::RdmaDevice::open(V(), {.port = 2}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(transport::rdma::RdmaDevice::open(V(), {.gidIndex = 9}).status().code(),
            StatusCode::kInvalidArgument);
  setEmulatedDeviceCount(1);
}

TEST_F(VerbsEmulationTest, ModifyQpRejectsWrongMasksAndLeavesTheStateAlone) {
  EXPECT_EQ(a_.qp->state, IBV_QPS_RESET);
  // RESET->INIT without ACCESS_FLAGS, or with an attribute RTR needs: EINVAL, still RESET.
  EXPECT_EQ(toInit(a_.qp, 0, IBV_QP_ACCESS_FLAGS), EINVAL);
  EXPECT_EQ(toInit(a_.qp, IBV_QP_DEST_QPN), EINVAL);
  EXPECT_EQ(a_.qp->state, IBV_QPS_RESET);
  // RESET->RTR skips INIT.
  EXPECT_EQ(toRtr(a_.qp, b_.qp->qp_num), EINVAL);
  ASSERT_EQ(toInit(a_.qp), 0);
  EXPECT_EQ(a_.qp->state, IBV_QPS_INIT);
  // INIT->RTR without MIN_RNR_TIMER / without AV / with SQ_PSN (an RTS attribute).
  EXPECT_EQ(toRtr(a_.qp, b_.qp->qp_num, 0, IBV_QP_MIN_RNR_TIMER), EINVAL);
  EXPECT_EQ(toRtr(a_.qp, b_.qp->qp_num, 0, IBV_QP_AV), EINVAL);
  EXPECT_EQ(toRtr(a_.qp, b_.qp->qp_num, IBV_QP_SQ_PSN), EINVAL);
  EXPECT_EQ(a_.qp->state, IBV_QPS_INIT);
  // INIT->RTS skips RTR.
  EXPECT_EQ(toRts(a_.qp), EINVAL);
  ASSERT_EQ(toRtr(a_.qp, b_.qp->qp_num), 0);
  // RTR->RTS without RNR_RETRY.
  EXPECT_EQ(toRts(a_.qp, 7, IBV_QP_RNR_RETRY), EINVAL);
  EXPECT_EQ(a_.qp->state, IBV_QPS_RTR);
  ASSERT_EQ(toRts(a_.qp), 0);
  EXPECT_EQ(a_.qp->state, IBV_QPS_RTS);
  // Any state -> ERR with IBV_QP_STATE alone; with more bits it is rejected.
  ibv_qp_attr e{};
  e.qp_state = IBV_QPS_ERR;
  EXPECT_EQ(V().modifyQp(a_.qp, &e, IBV_QP_STATE | IBV_QP_PORT), EINVAL);
  EXPECT_EQ(V().modifyQp(a_.qp, &e, IBV_QP_STATE), 0);
  EXPECT_EQ(a_.qp->state, IBV_QPS_ERR);
}

TEST_F(VerbsEmulationTest, PostingBeforeRtsFailsAndRecvBeforeInitFails) {
  EXPECT_EQ(postRecv(b_, 1, 0, 16), EINVAL);  // RESET
  ASSERT_EQ(toInit(a_.qp), 0);
  EXPECT_EQ(post(a_, IBV_WR_SEND, 1, 0, 8, 0, 0, 0), EINVAL);  // INIT
  ASSERT_EQ(toInit(b_.qp), 0);
  EXPECT_EQ(postRecv(b_, 1, 0, 16), 0);  // INIT accepts receives
}

TEST_F(VerbsEmulationTest, WriteWithImmediateConsumesARecvAndCompletesBothSides) {
  connect();
  for (int i = 0; i < 100; ++i) a_.buf[i] = static_cast<uint8_t>(i + 1);
  ASSERT_EQ(postRecv(b_, 77, 0, 0), 0);
  ASSERT_EQ(post(a_, IBV_WR_RDMA_WRITE_WITH_IMM, 5, 0, 100, addrOf(b_, 1000), b_.mr->rkey, 0xabc),
            0);
  auto req = pollN(a_.cq, 1);
  ASSERT_EQ(req.size(), 1u);
  EXPECT_EQ(req[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(req[0].opcode, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(req[0].wr_id, 5u);
  auto resp = pollN(b_.cq, 1);
  ASSERT_EQ(resp.size(), 1u);
  EXPECT_EQ(resp[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(resp[0].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  EXPECT_EQ(resp[0].wr_id, 77u);
  EXPECT_EQ(resp[0].byte_len, 100u);
  EXPECT_TRUE(resp[0].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(ntohl(resp[0].imm_data), 0xabcu);
  EXPECT_EQ(resp[0].qp_num, b_.qp->qp_num);  // the local QP of the completed WR
  for (int i = 0; i < 100; ++i) ASSERT_EQ(b_.buf[1000 + i], i + 1);
}

TEST_F(VerbsEmulationTest, SendRecvInOrderAndUnsignaledWritesCompleteSilently) {
  connect();
  ASSERT_EQ(postRecv(b_, 1, 0, 16), 0);
  ASSERT_EQ(postRecv(b_, 2, 16, 16), 0);
  a_.buf[0] = 11;
  a_.buf[8] = 22;
  // A plain RDMA WRITE consumes no RECV; unsignaled, it produces no requester completion.
  ASSERT_EQ(post(a_, IBV_WR_RDMA_WRITE, 9, 0, 4, addrOf(b_, 2000), b_.mr->rkey, 0, false), 0);
  ASSERT_EQ(post(a_, IBV_WR_SEND, 10, 0, 8, 0, 0, 0), 0);
  ASSERT_EQ(post(a_, IBV_WR_SEND, 11, 8, 8, 0, 0, 0), 0);
  auto req = pollN(a_.cq, 2);
  ASSERT_EQ(req.size(), 2u);
  EXPECT_EQ(req[0].wr_id, 10u);
  EXPECT_EQ(req[0].opcode, IBV_WC_SEND);
  EXPECT_EQ(req[1].wr_id, 11u);
  auto resp = pollN(b_.cq, 2);
  ASSERT_EQ(resp.size(), 2u);
  EXPECT_EQ(resp[0].opcode, IBV_WC_RECV);
  EXPECT_EQ(resp[0].wr_id, 1u);
  EXPECT_EQ(resp[0].byte_len, 8u);
  EXPECT_FALSE(resp[0].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(b_.buf[0], 11);
  EXPECT_EQ(resp[1].wr_id, 2u);
  EXPECT_EQ(b_.buf[16], 22);
  EXPECT_EQ(b_.buf[2000], 11);
}

TEST_F(VerbsEmulationTest, BadRkeyIsARemoteAccessErrorAndTheQpFlushesTheRest) {
  connect();
  ASSERT_EQ(postRecv(b_, 1, 0, 0), 0);
  ASSERT_EQ(post(a_, IBV_WR_RDMA_WRITE_WITH_IMM, 1, 0, 8, addrOf(b_, 0), b_.mr->rkey + 999, 0),
            0);
  ASSERT_EQ(post(a_, IBV_WR_SEND, 2, 0, 8, 0, 0, 0, /*signaled=*/false), 0);
  auto wc = pollN(a_.cq, 2);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(wc[0].wr_id, 1u);
  // Flushed WRs complete even when unsignaled.
  EXPECT_EQ(wc[1].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(wc[1].wr_id, 2u);
  EXPECT_EQ(a_.qp->state, IBV_QPS_ERR);
  EXPECT_STREQ(V().wcStatusStr(wc[0].status), "remote access error");
}

TEST_F(VerbsEmulationTest, OutOfBoundsAndMissingRemoteWriteAccessAreRemoteAccessErrors) {
  connect();
  ASSERT_EQ(postRecv(b_, 1, 0, 0), 0);
  // One byte past the end of b's region.
  ASSERT_EQ(post(a_, IBV_WR_RDMA_WRITE_WITH_IMM, 1, 0, 8, addrOf(b_, 4096 - 7), b_.mr->rkey, 0),
            0);
  auto wc = pollN(a_.cq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_REM_ACCESS_ERR);
  // The responder saw nothing: its RECV is still posted.
  EXPECT_TRUE(pollN(b_.cq, 0).empty());
}

TEST_F(VerbsEmulationTest, RegionWithoutRemoteWriteRejectsWrites) {
  std::vector<uint8_t> ro(64);
  ibv_mr* mr = V().regMr(b_.pd, ro.data(), ro.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  // ibv_reg_mr(3): REMOTE_WRITE without LOCAL_WRITE is invalid.
  errno = 0;
  EXPECT_EQ(V().regMr(b_.pd, ro.data(), ro.size(), IBV_ACCESS_REMOTE_WRITE), nullptr);
  EXPECT_EQ(errno, EINVAL);
  connect();
  ASSERT_EQ(post(a_, IBV_WR_RDMA_WRITE, 1, 0, 8, reinterpret_cast<uint64_t>(ro.data()), mr->rkey,
                 0),
            0);
  auto wc = pollN(a_.cq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(V().deregMr(mr), 0);
}

TEST_F(VerbsEmulationTest, ReceiverNotReadyExhaustsRnrRetries) {
  connect(/*rnrRetry=*/2, /*minRnr=*/1);  // 0.01 ms RNR timer, two retries
  ASSERT_EQ(post(a_, IBV_WR_SEND, 3, 0, 8, 0, 0, 0), 0);
  auto wc = pollN(a_.cq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_RNR_RETRY_EXC_ERR);
  EXPECT_EQ(a_.qp->state, IBV_QPS_ERR);
  EXPECT_STREQ(V().wcStatusStr(wc[0].status), "RNR retry counter exceeded");
}

TEST_F(VerbsEmulationTest, ReceiverNotReadyThenARecvArrivesSucceeds) {
  connect(/*rnrRetry=*/7, /*minRnr=*/1);  // 7: retry forever
  ASSERT_EQ(post(a_, IBV_WR_SEND, 3, 0, 8, 0, 0, 0), 0);
  EXPECT_TRUE(pollN(a_.cq, 0).empty());
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(postRecv(b_, 4, 0, 16), 0);
  auto wc = pollN(a_.cq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  auto r = pollN(b_.cq, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].opcode, IBV_WC_RECV);
}

TEST_F(VerbsEmulationTest, SendLargerThanTheRecvIsALengthError) {
  connect();
  ASSERT_EQ(postRecv(b_, 1, 0, 4), 0);
  ASSERT_EQ(post(a_, IBV_WR_SEND, 2, 0, 8, 0, 0, 0), 0);
  auto req = pollN(a_.cq, 1);
  ASSERT_EQ(req.size(), 1u);
  EXPECT_EQ(req[0].status, IBV_WC_REM_INV_REQ_ERR);
  auto resp = pollN(b_.cq, 1);
  ASSERT_EQ(resp.size(), 1u);
  EXPECT_EQ(resp[0].status, IBV_WC_LOC_LEN_ERR);
}

TEST_F(VerbsEmulationTest, DestroyedPeerGivesRetryExceeded) {
  connect();
  ASSERT_EQ(V().destroyQp(b_.qp), 0);
  b_.qp = nullptr;
  ASSERT_EQ(post(a_, IBV_WR_SEND, 2, 0, 8, 0, 0, 0), 0);
  auto wc = pollN(a_.cq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_RETRY_EXC_ERR);
}

TEST_F(VerbsEmulationTest, DestroyOrderIsEnforced) {
  // ibv_destroy_cq with a QP attached and ibv_dealloc_pd with resources: EBUSY.
  EXPECT_EQ(V().destroyCq(a_.cq), EBUSY);
  EXPECT_EQ(V().deallocPd(a_.pd), EBUSY);
}

// The emulation's status strings are rdma-core's own (checked when libibverbs is installed).
TEST(VerbsEmulationStringsTest, MatchRdmaCore) {
  auto real = transport::rdma::loadRealVerbs();
  if (!real.ok()) GTEST_SKIP() << real.status();
  for (ibv_wc_status s : {IBV_WC_SUCCESS, IBV_WC_LOC_LEN_ERR, IBV_WC_LOC_PROT_ERR,
                          IBV_WC_WR_FLUSH_ERR, IBV_WC_REM_INV_REQ_ERR, IBV_WC_REM_ACCESS_ERR,
                          IBV_WC_REM_OP_ERR, IBV_WC_RETRY_EXC_ERR, IBV_WC_RNR_RETRY_EXC_ERR}) {
    EXPECT_STREQ(V().wcStatusStr(s), (*real)->wcStatusStr(s)) << s;
  }
}

}  // namespace
}  // namespace cofab::testing
