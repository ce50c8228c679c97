// TEST DOUBLE: see verbs_emulation.h. Citations: "man X(3)" are the rdma-core libibverbs man
// pages (rdma-core 44); "IBA §x" the InfiniBand Architecture Specification vol. 1, rel. 1.4.
#include "tests/support/verbs_emulation.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace cofab::testing {
namespace {

using Clock = std::chrono::steady_clock;

struct EmuCq;
struct EmuPd;

struct EmuDevice {
  ibv_device dev{};  // first: the emulation hands out &dev
  int index = 0;
};

struct EmuContext {
  ibv_context ctx{};
  EmuDevice* device = nullptr;
};

struct EmuPd {
  ibv_pd pd{};
  int users = 0;  // MRs and QPs created on it
};

struct EmuMr {
  ibv_mr mr{};
  int access = 0;
};

struct EmuCq {
  ibv_cq cq{};
  std::deque<ibv_wc> entries;
  int users = 0;  // QPs attached
};

struct SendWr {
  uint64_t wrId = 0;
  ibv_wr_opcode opcode = IBV_WR_SEND;
  bool signaled = false;
  std::vector<ibv_sge> sges;
  uint64_t remoteAddr = 0;
  uint32_t rkey = 0;
  uint32_t imm = 0;
  int rnrRetriesLeft = 0;
  Clock::time_point nextAttempt{};
};

struct RecvWr {
  uint64_t wrId = 0;
  std::vector<ibv_sge> sges;
};

struct EmuQp {
  ibv_qp qp{};
  ibv_qp_cap cap{};
  bool sigAll = false;
  int access = 0;
  uint32_t destQpn = 0;
  uint8_t minRnrTimer = 0;
  uint8_t rnrRetry = 0;
  uint8_t retryCnt = 0;
  std::deque<SendWr> sq;  // posted, not yet executed (head may be waiting on RNR)
  std::deque<RecvWr> rq;
};

struct Fabric {
  std::mutex mu;
  int deviceCount = 1;
  std::vector<std::unique_ptr<EmuDevice>> devices;  // never freed: ibv_device outlives lists
  std::map<uint32_t, EmuQp*> qps;                   // by qp_num
  std::map<uint32_t, EmuMr*> mrs;                   // by rkey (== lkey here)
  uint32_t nextQpn = 0x100;
  uint32_t nextKey = 0x1000;
  uint64_t workRequests = 0;
  bool rkeyFault = false;
};

Fabric& fabric() {
  static Fabric* f = new Fabric();  // leaked: outlives every user thread at exit
  return *f;
}

EmuQp* emu(ibv_qp* qp) { return reinterpret_cast<EmuQp*>(qp); }
EmuCq* emu(ibv_cq* cq) { return reinterpret_cast<EmuCq*>(cq); }

// IBA §9.7.5.2.8 (RNR NAK timer encoding, Table 45): the period an RNR-NAKed requester waits
// before retrying, in microseconds, indexed by the responder's min_rnr_timer (0 = 655.36 ms).
constexpr uint32_t kRnrTimerUs[32] = {
    655360, 10,    20,    30,    40,    60,    80,     120,    160,    240,   320,
    480,    640,   960,   1280,  1920,  2560,  3840,   5120,   7680,   10240, 15360,
    20480,  30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520};

void pushCompletion(EmuCq* cq, const ibv_wc& wc) { cq->entries.push_back(wc); }

ibv_wc makeWc(uint64_t wrId, ibv_wc_status status, ibv_wc_opcode opcode, uint32_t qpNum) {
  ibv_wc wc{};
  wc.wr_id = wrId;
  wc.status = status;
  wc.opcode = opcode;
  wc.qp_num = qpNum;
  return wc;
}

ibv_wc_opcode requesterOpcode(ibv_wr_opcode op) {
  // man ibv_poll_cq(3): IBV_WC_SEND for SEND[_WITH_IMM], IBV_WC_RDMA_WRITE for RDMA_WRITE[_IMM].
  return (op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM) ? IBV_WC_RDMA_WRITE
                                                                       : IBV_WC_SEND;
}

// IBA §10.3.1 (QP state Error): outstanding and later work requests complete with a flush error;
// flushed completions are generated whether or not the WR was signaled (IBA §10.8.3.3).
void flushLocked(EmuQp* q) {
  for (auto& wr : q->sq) {
    pushCompletion(emu(q->qp.send_cq),
                   makeWc(wr.wrId, IBV_WC_WR_FLUSH_ERR, requesterOpcode(wr.opcode), q->qp.qp_num));
  }
  q->sq.clear();
  for (auto& wr : q->rq) {
    pushCompletion(emu(q->qp.recv_cq), makeWc(wr.wrId, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV,
                                              q->qp.qp_num));
  }
  q->rq.clear();
}

void toErrorLocked(EmuQp* q) {
  q->qp.state = IBV_QPS_ERR;
  flushLocked(q);
}

// Completes the head send WR with an error and moves the QP to the error state: IBA §9.9.2/§10.8
// (requester-detected errors are "completion errors": the WR completes in error, the QP enters
// Error and the remaining WRs are flushed).
void failHeadLocked(EmuQp* q, ibv_wc_status status) {
  SendWr wr = std::move(q->sq.front());
  q->sq.pop_front();
  pushCompletion(emu(q->qp.send_cq),
                 makeWc(wr.wrId, status, requesterOpcode(wr.opcode), q->qp.qp_num));
  toErrorLocked(q);
}

// man ibv_reg_mr(3) / ibv_post_send(3): an SGE is valid when its lkey names an MR of the QP's PD
// covering [addr, addr + length).
bool localOk(Fabric& f, EmuQp* q, const ibv_sge& s, int needAccess) {
  if (s.length == 0) return true;
  auto it = f.mrs.find(s.lkey);
  if (it == f.mrs.end()) return false;
  const ibv_mr& mr = it->second->mr;
  if (mr.pd != q->qp.pd) return false;
  const auto base = reinterpret_cast<uint64_t>(mr.addr);
  if (s.addr < base || s.length > mr.length || s.addr - base > mr.length - s.length) return false;
  return (it->second->access & needAccess) == needAccess;
}

// Executes the send queue in order (RC: IBA §9.5 "requests are executed in order") until it is
// empty or the head must wait for a RECV (RNR).
void progressLocked(Fabric& f, EmuQp* q) {
  while (!q->sq.empty() && q->qp.state == IBV_QPS_RTS) {
    SendWr& wr = q->sq.front();
    const auto now = Clock::now();
    if (wr.nextAttempt > now) return;  // waiting out the RNR timer
    uint64_t len = 0;
    for (const auto& s : wr.sges) {
      if (!localOk(f, q, s, 0)) return failHeadLocked(q, IBV_WC_LOC_PROT_ERR);
      len += s.length;
    }
    // The responder: gone, or not able to receive (IBA §10.3.1: only RTR/RTS QPs respond).
    auto dit = f.qps.find(q->destQpn);
    EmuQp* d = dit == f.qps.end() ? nullptr : dit->second;
    if (d == nullptr || (d->qp.state != IBV_QPS_RTR && d->qp.state != IBV_QPS_RTS) ||
        d->destQpn != q->qp.qp_num) {
      // No ACK ever comes: after retry_cnt transport retries the requester completes with
      // IBV_WC_RETRY_EXC_ERR (man ibv_poll_cq(3); IBA §9.7.6.1.3). The timeout is not modelled.
      return failHeadLocked(q, IBV_WC_RETRY_EXC_ERR);
    }
    const bool isWrite = wr.opcode == IBV_WR_RDMA_WRITE || wr.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
    const bool consumesRecv = wr.opcode != IBV_WR_RDMA_WRITE;
    uint8_t* target = nullptr;
    if (isWrite && len > 0) {
      // man ibv_reg_mr(3): remote writes need IBV_ACCESS_REMOTE_WRITE on the MR, and the QP must
      // allow them (qp_access_flags, man ibv_modify_qp(3)); the rkey must name an MR of the
      // responder's PD covering the range. Violations NAK with Remote Access Error (IBA
      // §9.7.5.2.4), which the requester reports as IBV_WC_REM_ACCESS_ERR (man ibv_poll_cq(3)).
      auto mit = f.mrs.find(wr.rkey);
      bool ok = !f.rkeyFault && mit != f.mrs.end() && mit->second->mr.pd == d->qp.pd &&
                (mit->second->access & IBV_ACCESS_REMOTE_WRITE) &&
                (d->access & IBV_ACCESS_REMOTE_WRITE);
      if (ok) {
        const ibv_mr& mr = mit->second->mr;
        const auto base = reinterpret_cast<uint64_t>(mr.addr);
        ok = wr.remoteAddr >= base && len <= mr.length && wr.remoteAddr - base <= mr.length - len;
      }
      if (!ok) return failHeadLocked(q, IBV_WC_REM_ACCESS_ERR);
      target = reinterpret_cast<uint8_t*>(wr.remoteAddr);
    } else if (isWrite && wr.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
      target = nullptr;  // zero-length write with immediate: only the RECV is consumed
    }
    if (consumesRecv && d->rq.empty()) {
      // Receiver not ready (IBA §9.7.5.2.8): RNR NAK; the requester retries after the
      // responder's min_rnr_timer, rnr_retry times; 7 means retry forever (man ibv_modify_qp(3)
      // field rnr_retry; IBA §9.7.5.2.8). Exhausted: IBV_WC_RNR_RETRY_EXC_ERR.
      if (q->rnrRetry != 7) {
        if (wr.rnrRetriesLeft == 0) return failHeadLocked(q, IBV_WC_RNR_RETRY_EXC_ERR);
        --wr.rnrRetriesLeft;
      }
      wr.nextAttempt = now + std::chrono::microseconds(kRnrTimerUs[d->minRnrTimer & 31]);
      return;
    }
    RecvWr rwr;
    if (consumesRecv) {
      rwr = std::move(d->rq.front());
      d->rq.pop_front();
    }
    if (wr.opcode == IBV_WR_SEND || wr.opcode == IBV_WR_SEND_WITH_IMM) {
      uint64_t room = 0;
      for (const auto& s : rwr.sges) {
        if (!localOk(f, d, s, IBV_ACCESS_LOCAL_WRITE)) {
          // Responder-side local protection error: the responder completes its RECV in error
          // and NAKs (IBA §9.7.5.2.4 / man ibv_poll_cq(3) IBV_WC_LOC_PROT_ERR).
          pushCompletion(emu(d->qp.recv_cq),
                         makeWc(rwr.wrId, IBV_WC_LOC_PROT_ERR, IBV_WC_RECV, d->qp.qp_num));
          toErrorLocked(d);
          return failHeadLocked(q, IBV_WC_REM_OP_ERR);
        }
        room += s.length;
      }
      if (len > room) {
        // The message does not fit the RECV's buffers: IBV_WC_LOC_LEN_ERR at the responder,
        // Invalid Request NAK (IBV_WC_REM_INV_REQ_ERR) at the requester (man ibv_poll_cq(3)).
        pushCompletion(emu(d->qp.recv_cq),
                       makeWc(rwr.wrId, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV, d->qp.qp_num));
        toErrorLocked(d);
        return failHeadLocked(q, IBV_WC_REM_INV_REQ_ERR);
      }
      // Scatter the gathered bytes into the RECV's list in order.
      size_t di = 0, doff = 0;
      for (const auto& s : wr.sges) {
        const auto* src = reinterpret_cast<const uint8_t*>(s.addr);
        uint64_t left = s.length;
        while (left > 0) {
          const ibv_sge& t = rwr.sges[di];
          const uint64_t n = std::min<uint64_t>(left, t.length - doff);
          std::memcpy(reinterpret_cast<uint8_t*>(t.addr) + doff, src, n);
          src += n;
          left -= n;
          doff += n;
          if (doff == t.length) ++di, doff = 0;
        }
      }
    } else if (target != nullptr) {
      for (const auto& s : wr.sges) {
        std::memcpy(target, reinterpret_cast<const void*>(s.addr), s.length);
        target += s.length;
      }
    }
    ++f.workRequests;
    if (consumesRecv) {
      // man ibv_poll_cq(3): responder opcode IBV_WC_RECV or IBV_WC_RECV_RDMA_WITH_IMM; byte_len
      // is the number of bytes transferred; imm_data valid with IBV_WC_WITH_IMM in wc_flags
      // (passed through in network byte order, as posted). src_qp is left 0: the man page
      // defines it for UD QPs only, so RC code must not rely on it.
      ibv_wc wc = makeWc(rwr.wrId, IBV_WC_SUCCESS,
                         wr.opcode == IBV_WR_RDMA_WRITE_WITH_IMM ? IBV_WC_RECV_RDMA_WITH_IMM
                                                                 : IBV_WC_RECV,
                         d->qp.qp_num);
      wc.byte_len = static_cast<uint32_t>(len);
      if (wr.opcode != IBV_WR_SEND) {
        wc.wc_flags = IBV_WC_WITH_IMM;
        wc.imm_data = wr.imm;
      }
      pushCompletion(emu(d->qp.recv_cq), wc);
    }
    // man ibv_post_send(3): a completion is generated for a successful WR only when it was
    // IBV_SEND_SIGNALED or the QP was created with sq_sig_all.
    if (wr.signaled) {
      ibv_wc wc = makeWc(wr.wrId, IBV_WC_SUCCESS, requesterOpcode(wr.opcode), q->qp.qp_num);
      wc.byte_len = static_cast<uint32_t>(len);
      pushCompletion(emu(q->qp.send_cq), wc);
    }
    q->sq.pop_front();
  }
}

// Runs every QP whose head may be waiting (RNR retries progress as time passes).
void progressAllLocked(Fabric& f) {
  for (auto& [qpn, q] : f.qps) progressLocked(f, q);
}

// --- the table entries -------------------------------------------------------------------------

ibv_device** getDeviceList(int* num) {
  Fabric& f = fabric();
  std::lock_guard<std::mutex> lock(f.mu);
  if (f.deviceCount < 0) {
    // What rdma-core returns when the kernel has no uverbs support (man ibv_get_device_list(3):
    // NULL on failure with errno set; ENOSYS = 38 on these machines).
    errno = ENOSYS;
    return nullptr;
  }
  while (static_cast<int>(f.devices.size()) < f.deviceCount) {
    auto d = std::make_unique<EmuDevice>();
    d->index = static_cast<int>(f.devices.size());
    std::snprintf(d->dev.name, sizeof(d->dev.name), "emu%d", d->index);
    d->dev.node_type = IBV_NODE_CA;
    d->dev.transport_type = IBV_TRANSPORT_IB;
    f.devices.push_back(std::move(d));
  }
  // man ibv_get_device_list(3): a NULL-terminated array, freed with ibv_free_device_list().
  auto** list = new ibv_device*[f.deviceCount + 1];
  for (int i = 0; i < f.deviceCount; ++i) list[i] = &f.devices[i]->dev;
  list[f.deviceCount] = nullptr;
  if (num != nullptr) *num = f.deviceCount;
  return list;
}

void freeDeviceList(ibv_device** list) { delete[] list; }

const char* getDeviceName(ibv_device* d) { return d->name; }

ibv_context* openDevice(ibv_device* d) {
  auto* c = new EmuContext();
  c->device = reinterpret_cast<EmuDevice*>(d);
  c->ctx.device = d;
  c->ctx.num_comp_vectors = 1;
  return &c->ctx;
}

int closeDevice(ibv_context* c) {
  delete reinterpret_cast<EmuContext*>(c);
  return 0;
}

int queryPort(ibv_context*, uint8_t port, ibv_port_attr* attr) {
  // One active InfiniBand port numbered 1 (ports count from 1: man ibv_query_port(3)).
  if (port != 1) return EINVAL;
  std::memset(attr, 0, sizeof(*attr));
  attr->state = IBV_PORT_ACTIVE;
  attr->max_mtu = IBV_MTU_4096;
  attr->active_mtu = IBV_MTU_4096;
  attr->gid_tbl_len = 4;
  attr->lid = 1;
  attr->link_layer = IBV_LINK_LAYER_INFINIBAND;
  return 0;
}

int queryGid(ibv_context* c, uint8_t port, int index, ibv_gid* gid) {
  // man ibv_query_gid(3): 0 on success, -1 on error.
  if (port != 1 || index < 0 || index >= 4) {
    errno = EINVAL;
    return -1;
  }
  std::memset(gid, 0, sizeof(*gid));
  gid->raw[0] = 0xfe;
  gid->raw[1] = 0x80;
  gid->raw[14] = static_cast<uint8_t>(index);
  gid->raw[15] = static_cast<uint8_t>(reinterpret_cast<EmuContext*>(c)->device->index + 1);
  return 0;
}

ibv_pd* allocPd(ibv_context* c) {
  auto* p = new EmuPd();
  p->pd.context = c;
  return &p->pd;
}

int deallocPd(ibv_pd* pd) {
  Fabric& f = fabric();
  std::lock_guard<std::mutex> lock(f.mu);
  auto* p = reinterpret_cast<EmuPd*>(pd);
  // man ibv_alloc_pd(3): ibv_dealloc_pd fails if any other resource is still associated (EBUSY).
  if (p->users > 0) return EBUSY;
  delete p;
  return 0;
}

ibv_mr* regMr(ibv_pd* pd, void* addr, size_t length, int access) {
  // man ibv_reg_mr(3): REMOTE_WRITE (and REMOTE_ATOMIC) require LOCAL_WRITE; NULL + errno on
  // failure.
  if ((access & IBV_ACCESS_REMOTE_WRITE) && !(access & IBV_ACCESS_LOCAL_WRITE)) {
    errno = EINVAL;
    return nullptr;
  }
  if (addr == nullptr && length > 0) {
    errno = EINVAL;
    return nullptr;
  }
  Fabric& f = fabric();
  std::lock_guard<std::mutex> lock(f.mu);
  auto* m = new EmuMr();
  m->mr.context = pd->context;
  m->mr.pd = pd;
  m->mr.addr = addr;
  m->mr.length = length;
  m->mr.lkey = m->mr.rkey = f.nextKey++;
  m->access = access;
  f.mrs[m->mr.lkey] = m;
  ++reinterpret_cast<EmuPd*>(pd)->users;
  return &m->mr;
}

int deregMr(ibv_mr* mr) {
  Fabric& f = fabric();
  std::lock_guard<std::mutex> lock(f.mu);
  auto* m = reinterpret_cast<EmuMr*>(mr);
  f.mrs.erase(mr->lkey);
  --reinterpret_cast<EmuPd*>(mr->pd)->users;
  delete m;
  return 0;
}

ibv_cq* createCq(ibv_context* c, int cqe, void* cqContext, ibv_comp_channel* channel, int) {
  // man ibv_create_cq(3): cqe is the minimum size; NULL + errno on failure. Channels are not
  // emulated (the transport polls).
  if (cqe < 1 || channel != nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  auto* q = new EmuCq();
  q->cq.context = c;
  q->cq.cq_context = cqContext;
  q->cq.cqe = cqe;
  return &q->cq;
}

int destroyCq(ibv_cq* cq) {
  Fabric& f = fabric();
  std::lock_guard<std::mutex> lock(f.mu);
  // man ibv_create_cq(3) (ibv_destroy_cq): fails with EBUSY while a QP is still associated.
  if (emu(cq)->users > 0) return EBUSY;
  delete emu(cq);
  return 0;
}

ibv_qp* createQp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  // Only what the transport uses: RC, no SRQ (man ibv_create_qp(3)).
  if (attr->qp_type != IBV_QPT_RC || attr->srq != nullptr || attr->send_cq == nullptr ||
      attr->recv_cq == nullptr || attr->cap.max_send_wr == 0 || attr->cap.max_send_sge == 0) {
    errno = EINVAL;
    return nullptr;
  }
  Fabric& f = fabric();
  std::lock_guard<std::mutex> lock(f.mu);
  auto* q = new EmuQp();
  q->qp.context = pd->context;
  q->qp.qp_context = attr->qp_context;
  q->qp.pd = pd;
  q->qp.send_cq = attr->send_cq;
  q->qp.recv_cq = attr->recv_cq;
  q->qp.qp_type = IBV_QPT_RC;
  q->qp.qp_num = f.nextQpn++;
  // man ibv_create_qp(3): a new QP starts in the RESET state.
  q->qp.state = IBV_QPS_RESET;
  q->cap = attr->cap;
  q->sigAll = attr->sq_sig_all != 0;
  ++emu(attr->send_cq)->users;
  ++emu(attr->recv_cq)->users;
  ++reinterpret_cast<EmuPd*>(pd)->users;
  f.qps[q->qp.qp_num] = q;
  return &q->qp;
}

int destroyQp(ibv_qp* qp) {
  Fabric& f = fabric();
  std::lock_guard<std::mutex> lock(f.mu);
  EmuQp* q = emu(qp);
  f.qps.erase(qp->qp_num);
  --emu(qp->send_cq)->users;
  --emu(qp->recv_cq)->users;
  --reinterpret_cast<EmuPd*>(qp->pd)->users;
  delete q;
  return 0;
}

// man ibv_modify_qp(3), table for IBV_QPT_RC: the minimum attributes each transition requires.
// The optional ones follow the kernel's transition table (ib_modify_qp_is_ok() in
// drivers/infiniband/core/verbs.c, which implements IBA §10.3 / Table 91 "QP state transition
// properties"); any other bit, or a transition not in the table, is EINVAL and nothing changes
// ("If any of the modify attributes or the modify mask are invalid, none of the attributes will
// be modified": man ibv_modify_qp(3), NOTES).
struct Transition {
  ibv_qp_state from, to;
  int required, optional;
};
constexpr int kRtrOptional = IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX;
constexpr int kRtsOptional = IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS |
                             IBV_QP_MIN_RNR_TIMER | IBV_QP_PATH_MIG_STATE;
constexpr Transition kTransitions[] = {
    {IBV_QPS_RESET, IBV_QPS_INIT,
     IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0},
    {IBV_QPS_INIT, IBV_QPS_INIT, IBV_QP_STATE,
     IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS},
    {IBV_QPS_INIT, IBV_QPS_RTR,
     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
     kRtrOptional},
    {IBV_QPS_RTR, IBV_QPS_RTS,
     IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_RETRY_CNT |
         IBV_QP_RNR_RETRY | IBV_QP_TIMEOUT,
     kRtsOptional},
    {IBV_QPS_RTS, IBV_QPS_RTS, IBV_QP_STATE, kRtsOptional},
};

int modifyQp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  Fabric& f = fabric();
  std::lock_guard<std::mutex> lock(f.mu);
  EmuQp* q = emu(qp);
  if (!(mask & IBV_QP_STATE)) return EINVAL;  // the transport only ever changes states
  const ibv_qp_state from = qp->state;
  const ibv_qp_state to = attr->qp_state;
  // IBA §10.3.1: any state may go to Reset or Error with no other attribute.
  if (to == IBV_QPS_RESET || to == IBV_QPS_ERR) {
    if (mask != IBV_QP_STATE) return EINVAL;
    if (to == IBV_QPS_ERR) {
      toErrorLocked(q);
    } else {
      q->sq.clear();  // Reset discards queued WRs without completions (IBA §10.3.1)
      q->rq.clear();
      qp->state = IBV_QPS_RESET;
    }
    return 0;
  }
  const Transition* t = nullptr;
  for (const auto& c : kTransitions) {
    if (c.from == from && c.to == to) t = &c;
  }
  if (t == nullptr) return EINVAL;
  if ((mask & t->required) != t->required) return EINVAL;
  if (mask & ~(t->required | t->optional)) return EINVAL;
  if ((mask & IBV_QP_PORT) && attr->port_num != 1) return EINVAL;
  // The path must name the port this QP was bound to at INIT (ah_attr.port_num).
  if ((mask & IBV_QP_AV) && attr->ah_attr.port_num != 1) return EINVAL;
  if (mask & IBV_QP_ACCESS_FLAGS) q->access = attr->qp_access_flags;
  if (mask & IBV_QP_DEST_QPN) q->destQpn = attr->dest_qp_num;
  if (mask & IBV_QP_MIN_RNR_TIMER) q->minRnrTimer = attr->min_rnr_timer;
  if (mask & IBV_QP_RNR_RETRY) q->rnrRetry = attr->rnr_retry;
  if (mask & IBV_QP_RETRY_CNT) q->retryCnt = attr->retry_cnt;
  qp->state = to;
  return 0;
}

int postSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  Fabric& f = fabric();
  std::lock_guard<std::mutex> lock(f.mu);
  EmuQp* q = emu(qp);
  for (; wr != nullptr; wr = wr->next) {
    // man ibv_post_send(3): returns 0 or the value of errno, setting *bad_wr to the first WR
    // that was not posted. Posting to a QP before RTS is an immediate error (IBA §10.8.2 /
    // §10.3.1); in Error the WR is accepted and flushed.
    int err = 0;
    if (qp->state == IBV_QPS_RESET || qp->state == IBV_QPS_INIT || qp->state == IBV_QPS_RTR) {
      err = EINVAL;
    } else if (wr->num_sge > static_cast<int>(q->cap.max_send_sge) ||
               (wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_SEND_WITH_IMM &&
                wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM) ||
               (wr->send_flags & IBV_SEND_INLINE)) {
      err = EINVAL;  // outside the emulated subset
    } else if (q->sq.size() >= q->cap.max_send_wr) {
      err = ENOMEM;  // send queue full
    }
    if (err != 0) {
      if (bad) *bad = wr;
      return err;
    }
    SendWr s;
    s.wrId = wr->wr_id;
    s.opcode = wr->opcode;
    s.signaled = q->sigAll || (wr->send_flags & IBV_SEND_SIGNALED);
    s.sges.assign(wr->sg_list, wr->sg_list + wr->num_sge);
    s.remoteAddr = wr->wr.rdma.remote_addr;
    s.rkey = wr->wr.rdma.rkey;
    s.imm = wr->imm_data;
    s.rnrRetriesLeft = q->rnrRetry;
    q->sq.push_back(std::move(s));
    if (qp->state == IBV_QPS_ERR) flushLocked(q);
  }
  progressLocked(f, q);
  return 0;
}

int postRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  Fabric& f = fabric();
  std::lock_guard<std::mutex> lock(f.mu);
  EmuQp* q = emu(qp);
  for (; wr != nullptr; wr = wr->next) {
    // man ibv_post_recv(3): RECVs may be posted from INIT on (not in RESET); 0 or errno with
    // *bad_wr set.
    int err = 0;
    if (qp->state == IBV_QPS_RESET) {
      err = EINVAL;
    } else if (wr->num_sge > static_cast<int>(q->cap.max_recv_sge)) {
      err = EINVAL;
    } else if (q->rq.size() >= q->cap.max_recv_wr) {
      err = ENOMEM;
    }
    if (err != 0) {
      if (bad) *bad = wr;
      return err;
    }
    q->rq.push_back({wr->wr_id, std::vector<ibv_sge>(wr->sg_list, wr->sg_list + wr->num_sge)});
    if (qp->state == IBV_QPS_ERR) flushLocked(q);
  }
  progressAllLocked(f);  // a requester may be waiting for this RECV
  return 0;
}

int pollCq(ibv_cq* cq, int n, ibv_wc* wc) {
  Fabric& f = fabric();
  std::lock_guard<std::mutex> lock(f.mu);
  progressAllLocked(f);
  // man ibv_poll_cq(3): returns the number of completions found (0..num_entries), oldest first.
  EmuCq* q = emu(cq);
  int i = 0;
  for (; i < n && !q->entries.empty(); ++i) {
    wc[i] = q->entries.front();
    q->entries.pop_front();
  }
  return i;
}

const char* wcStatusStr(ibv_wc_status s) {
  // The strings of rdma-core's ibv_wc_status_str() for the statuses the emulation produces.
  switch (s) {
    case IBV_WC_SUCCESS: return "success";
    case IBV_WC_LOC_LEN_ERR: return "local length error";
    case IBV_WC_LOC_PROT_ERR: return "local protection error";
    case IBV_WC_WR_FLUSH_ERR: return "Work Request Flushed Error";
    case IBV_WC_REM_INV_REQ_ERR: return "remote invalid request error";
    case IBV_WC_REM_ACCESS_ERR: return "remote access error";
    case IBV_WC_REM_OP_ERR: return "remote operation error";
    case IBV_WC_RETRY_EXC_ERR: return "transport retry counter exceeded";
    case IBV_WC_RNR_RETRY_EXC_ERR: return "RNR retry counter exceeded";
    default: return "unknown";
  }
}


}  // namespace

const transport::rdma::VerbsApi& emulatedVerbs() {
  static const transport::rdma::VerbsApi api = [] {
    transport::rdma::VerbsApi a;
    a.binding = "verbs emulation (test double)";
    a.getDeviceList = getDeviceList;
    a.freeDeviceList = freeDeviceList;
    a.getDeviceName = getDeviceName;
    a.openDevice = openDevice;
    a.closeDevice = closeDevice;
    a.queryPort = queryPort;
    a.queryGid = queryGid;
    a.allocPd = allocPd;
    a.deallocPd = deallocPd;
    a.regMr = regMr;
    a.deregMr = deregMr;
    a.createCq = createCq;
    a.destroyCq = destroyCq;
    a.createQp = createQp;
    a.destroyQp = destroyQp;
    a.modifyQp = modifyQp;
    a.postSend = postSend;
    a.postRecv = postRecv;
    a.pollCq = pollCq;
    a.wcStatusStr = wcStatusStr;
    return a;
  }();
  return api;
}

void setEmulatedDeviceCount(int n) {
  Fabric& f = fabric();
  std::lock_guard<std::mutex> lock(f.mu);
  f.deviceCount = n;
}

void setEmulatedRkeyFault(bool on) {
  Fabric& f = fabric();
  std::lock_guard<std::mutex> lock(f.mu);
  f.rkeyFault = on;
}

uint64_t emulatedWorkRequests() {
  Fabric& f = fabric();
  std::lock_guard<std::mutex> lock(f.mu);
  return f.workRequests;
}

}  // namespace cofab::testing
