// TEST DOUBLE — an in-process emulation of exactly the libibverbs subset the rdma transport
// uses (fabric/transport/rdma/verbs_api.h). It is not rdma-core and not a device model: it exists
// so the transport's logic can run in tests on machines without RDMA hardware (the development
// and CI machines have no RDMA support in the kernel at all). Timings measured over it say
// nothing about hardware.
//
// What it models, each with the man page or InfiniBand Architecture Specification (IBA, vol. 1,
// release 1.4) section it follows, cited next to the code in verbs_emulation.cc:
//   - devices/ports/GIDs: one active port per device, GID = fe80::<device index>;
//   - ibv_modify_qp state machine RESET→INIT→RTR→RTS with the required attribute masks of
//     ibv_modify_qp(3) for RC, rejecting missing or unexpected bits with EINVAL;
//   - RC in-order execution of SEND, SEND_WITH_IMM, RDMA_WRITE and RDMA_WRITE_WITH_IMM; the
//     _WITH_IMM and SEND operations consume the responder's oldest posted RECV;
//   - completions with the opcode, byte_len, imm_data, wc_flags and qp_num of
//     ibv_poll_cq(3); unsignaled successful sends produce none (ibv_post_send(3));
//   - lkey/rkey and bounds checks (ibv_reg_mr(3) access flags): local errors are
//     IBV_WC_LOC_PROT_ERR, remote ones IBV_WC_REM_ACCESS_ERR on the requester; the QP then
//     enters the error state and later work requests complete with IBV_WC_WR_FLUSH_ERR;
//   - receiver not ready: with no RECV posted the requester retries every min_rnr_timer period
//     rnr_retry times (7 = forever) then completes with IBV_WC_RNR_RETRY_EXC_ERR;
//   - a destination QP that is gone or not in RTR/RTS: IBV_WC_RETRY_EXC_ERR (transport retries
//     exhausted), without modelling the ack timeout's duration.
// Not modelled: RDMA READ, atomics, SRQ, UD/UC, inline data, completion channels, CQ overrun
// events, path MTU segmentation, PSN checking, asynchronous events.
//
// Threading: every entry point takes one process-wide mutex; work requests execute during
// ibv_post_send/ibv_post_recv/ibv_poll_cq calls (a blocked RNR retry progresses when either side
// polls). Safe from any thread. Objects are the real verbs structs (embedded first in the
// emulation's own), so code written against <infiniband/verbs.h> reads them normally.
#pragma once

#include "fabric/transport/rdma/verbs_api.h"

namespace cofab::testing {

// The emulated table; the same fabric is shared by every user in the process (as the wire is).
const transport::rdma::VerbsApi& emulatedVerbs();

// How ibv_get_device_list answers: n >= 1 devices "emu0".."emu<n-1>"; 0: an empty list; -1: NULL
// with errno ENOSYS, as on a kernel without RDMA support. Default 1. Affects later calls only.
void setEmulatedDeviceCount(int n);

// Fault injection: while set, every RDMA WRITE's rkey check fails (the requester sees
// IBV_WC_REM_ACCESS_ERR and its QP enters the error state), as if the peer had deregistered.
void setEmulatedRkeyFault(bool on);

// Work requests the emulation executed so far (for tests that check traffic happened).
uint64_t emulatedWorkRequests();

}  // namespace cofab::testing
