#include "fabric/transport/rdma/qp_info.h"

#include <cstring>

namespace cofab::transport::rdma {
namespace {

constexpr uint32_t kInfoMagic = 0x51504331;  // "1CPQ"
constexpr size_t kInfoSize = 4 + 4 + 4 + 2 + 1 + 1 + 16 + 8 + 4 + 4 + 4;

// Explicit little-endian fields: the two ends may be different machines.
template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<uint8_t>(uint64_t(v) >> (8 * i)));
}
template <typename T>
T get(const uint8_t*& p) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= uint64_t(p[i]) << (8 * i);
  p += sizeof(T);
  return static_cast<T>(v);
}

}  // namespace

std::vector<uint8_t> encodeQpInfo(const QpInfo& info) {
  std::vector<uint8_t> out;
  out.reserve(kInfoSize);
  put<uint32_t>(out, kInfoMagic);
  put<uint32_t>(out, info.qpNum);
  put<uint32_t>(out, info.psn);
  put<uint16_t>(out, info.lid);
  put<uint8_t>(out, info.mtu);
  put<uint8_t>(out, 0);
  out.insert(out.end(), info.gid.raw, info.gid.raw + 16);
  put<uint64_t>(out, info.slotAddr);
  put<uint32_t>(out, info.slotRkey);
  put<uint32_t>(out, info.slotCount);
  put<uint32_t>(out, info.slotBytes);
  return out;
}

StatusOr<QpInfo> decodeQpInfo(std::span<const uint8_t> bytes) {
  if (bytes.size() != kInfoSize) {
    return InvalidArgument("rdma set-up: peer sent " + std::to_string(bytes.size()) +
                           " bytes of QP information, expected " + std::to_string(kInfoSize) +
                           " (a different cofab version, or not an rdma peer?)");
  }
  const uint8_t* p = bytes.data();
  if (get<uint32_t>(p) != kInfoMagic) {
    return InvalidArgument("rdma set-up: peer's QP information has a bad magic number");
  }
  QpInfo i;
  i.qpNum = get<uint32_t>(p);
  i.psn = get<uint32_t>(p) & 0xffffff;
  i.lid = get<uint16_t>(p);
  i.mtu = get<uint8_t>(p);
  p += 1;
  std::memcpy(i.gid.raw, p, 16);
  p += 16;
  i.slotAddr = get<uint64_t>(p);
  i.slotRkey = get<uint32_t>(p);
  i.slotCount = get<uint32_t>(p);
  i.slotBytes = get<uint32_t>(p);
  if (i.slotCount == 0 || i.slotBytes < 128 || i.mtu < IBV_MTU_256 || i.mtu > IBV_MTU_4096) {
    return InvalidArgument("rdma set-up: peer announced " + std::to_string(i.slotCount) +
                           " slots of " + std::to_string(i.slotBytes) + " bytes, mtu code " +
                           std::to_string(i.mtu) + ": not usable");
  }
  return i;
}

}  // namespace cofab::transport::rdma
