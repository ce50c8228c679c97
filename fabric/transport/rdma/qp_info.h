// QpInfo: what one end of an rdma connection tells the other during set-up, and its encoding on
// the TCP side channel. Internal to fabric/transport/rdma.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "fabric/transport/rdma/verbs_api.h"

namespace cofab::transport::rdma {

struct QpInfo {
  uint32_t qpNum = 0;
  uint32_t psn = 0;  // 24 bits: first PSN this side sends (the peer's rq_psn)
  uint16_t lid = 0;
  uint8_t mtu = 0;   // ibv_mtu of the port
  ibv_gid gid{};
  uint64_t slotAddr = 0;  // receive slots: remote address, rkey, count and size
  uint32_t slotRkey = 0;
  uint32_t slotCount = 0;
  uint32_t slotBytes = 0;
};

inline constexpr uint8_t kOpcodeQpInfo = 1;  // wire::Header::opcode of set-up messages
inline constexpr uint8_t kOpcodeReady = 2;
// The accepting side could not set up its end: one byte of StatusCode, then the message.
inline constexpr uint8_t kOpcodeSetupError = 3;
// On an established connection's side channel: this end failed the connection (the message
// says why), sent before the channel is closed so the peer does not take it for a death.
inline constexpr uint8_t kOpcodeFailed = 4;

std::vector<uint8_t> encodeQpInfo(const QpInfo& info);
// InvalidArgument naming what is wrong with a peer's bytes.
StatusOr<QpInfo> decodeQpInfo(std::span<const uint8_t> bytes);

}  // namespace cofab::transport::rdma
