#include "fabric/coded/shuffle_segments.h"

namespace cofab::coded {

uint32_t shuffleSegmentCount(size_t rowBytes, size_t segmentBytes) {
  if (segmentBytes == 0) return 0;
  return static_cast<uint32_t>((rowBytes + segmentBytes - 1) / segmentBytes);
}

size_t shuffleSegmentSize(size_t rowBytes, uint32_t count, uint32_t index, size_t offset,
                          size_t length) {
  if (rowBytes == 0 || count == 0 || index >= count || length == 0) return 0;
  if (count == 1) return offset == 0 && length == rowBytes ? rowBytes : 0;
  size_t s = 0;
  if (index + 1 < count) {
    // A full piece: its length is S.
    s = length;
    if (offset != static_cast<size_t>(index) * s) return 0;
  } else {
    // The last piece: S is implied by where it starts; it runs to the row's end.
    if (offset % index != 0) return 0;
    s = offset / index;
    if (s == 0 || length > s || offset + length != rowBytes) return 0;
  }
  return shuffleSegmentCount(rowBytes, s) == count ? s : 0;
}

}  // namespace cofab::coded
