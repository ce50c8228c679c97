// The rdma transport: RC queue pairs over libibverbs, reached through a dlopen'd function table
// (verbs_api.h). The only header of fabric/transport/rdma/ meant for use outside it.
//
// Addresses: a listener's address is the "host:port" of a small TCP side channel (the project's
// tcp transport) that carries the connection set-up — QP number, LID, GID, PSN, and the receive
// slots' address and rkey — and afterwards only liveness (a peer that dies closes it; RDMA alone
// would not tell a waiting receiver). Payloads travel as RDMA WRITE WITH IMMEDIATE into the
// peer's pre-registered receive slots; credits and the orderly goodbye as SEND/RECV.
//
// Parameters (environment, see `cofab-info`): COFAB_IB_DEVICE, COFAB_IB_PORT,
// COFAB_IB_GID_INDEX (device selection), COFAB_IB_SLOTS, COFAB_IB_SLOT_BYTES (receive slots per
// connection and their size). docs/RDMA.md is the operator's checklist.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "fabric/transport/context.h"
#include "fabric/transport/rdma/rdma_device.h"
#include "fabric/transport/rdma/verbs_api.h"

namespace cofab::transport::rdma {

struct RdmaOptions {
  // The verbs binding: null loads libibverbs.so.1 (loadRealVerbs()). Tests pass the emulation.
  const VerbsApi* verbs = nullptr;
  DeviceOptions device;
  int slots = 0;      // 0: COFAB_IB_SLOTS
  int slotBytes = 0;  // 0: COFAB_IB_SLOT_BYTES
  // How long an accepted side channel may take to finish the set-up; 0: COFAB_IB_SETUP_TIMEOUT_MS.
  int64_t setupTimeoutMs = 0;
};

// Unavailable with the reason when rdma-core or a device is missing.
StatusOr<std::shared_ptr<Context>> createContext(const ContextOptions& options,
                                                 const RdmaOptions& rdma = {});

// For tests only: the binding Registry::create("rdma") uses instead of libibverbs.so.1 (null
// restores the real one). Process-wide; set it before creating contexts.
void setVerbsForRegistryTesting(const VerbsApi* verbs);

}  // namespace cofab::transport::rdma
