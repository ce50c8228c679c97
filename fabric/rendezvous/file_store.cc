#include "fabric/rendezvous/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "fabric/rendezvous/hash_store.h"

namespace cofab {
namespace {

// Keys are arbitrary bytes; file names are hex so any key maps to a valid, distinct name.
// Keys too long for a file name (NAME_MAX) are hashed; the file keeps the full key and reads
// check it, so a hash collision is reported, never silently merged.
constexpr size_t kMaxHexKey = 100;

uint64_t fnv1a(std::string_view s, uint64_t seed) {
  uint64_t h = seed;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string hex(std::string_view s) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(s.size() * 2);
  for (unsigned char c : s) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

Status writeAll(int fd, const void* data, size_t len, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (len > 0) {
    ssize_t n = ::write(fd, p, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errnoStatus(StatusCode::kIoError, "write " + path, errno);
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return OkStatus();
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

StatusOr<std::unique_ptr<FileStore>> FileStore::open(const std::string& dir) {
  if (dir.empty() || dir[0] != '/') {
    return InvalidArgument("FileStore directory must be an absolute path, got '" + dir + "'");
  }
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return errnoStatus(StatusCode::kIoError, "mkdir " + dir, errno);
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return errnoStatus(StatusCode::kIoError, "stat " + dir, errno);
  if (!S_ISDIR(st.st_mode))
    return InvalidArgument("FileStore path '" + dir + "' is not a directory");
  return std::unique_ptr<FileStore>(new FileStore(dir));
}

std::string FileStore::pathFor(std::string_view key) const {
  if (key.size() <= kMaxHexKey) return dir_ + "/k_" + hex(key);
  char buf[48];
  snprintf(buf, sizeof(buf), "%016llx%016llx",
           static_cast<unsigned long long>(fnv1a(key, 14695981039346656037ull)),
           static_cast<unsigned long long>(fnv1a(key, 0x9e3779b97f4a7c15ull)));
  return dir_ + "/h_" + buf;
}

// File layout: u32 key length, key bytes, value bytes.
StatusOr<Bytes> FileStore::readKey(std::string_view key, bool* found) const {
  std::string path = pathFor(key);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) {
      *found = false;
      return Bytes{};
    }
    return errnoStatus(StatusCode::kIoError, "open " + path, errno);
  }
  Fd guard(fd);
  Bytes content;
  uint8_t buf[65536];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errnoStatus(StatusCode::kIoError, "read " + path, errno);
    }
    if (n == 0) break;
    content.insert(content.end(), buf, buf + n);
  }
  uint32_t klen = 0;
  if (content.size() < sizeof(klen)) return DataLoss("FileStore file " + path + " is truncated");
  memcpy(&klen, content.data(), sizeof(klen));
  if (content.size() < sizeof(klen) + klen ||
      std::string_view(reinterpret_cast<const char*>(content.data()) + 4, klen) != key) {
    return DataLoss("FileStore file " + path + " does not hold key '" + std::string(key) +
                    "' (corrupted, or a hash collision of long keys)");
  }
  *found = true;
  return Bytes(content.begin() + 4 + klen, content.end());
}

Status FileStore::writeKey(std::string_view key, const Bytes& value) {
  std::string path = pathFor(key);
  // A unique name from mkostemp: a pid and counter collided with a second FileStore on the same
  // directory in one process, and with a crashed run's leftover after pid reuse.
  std::string tmp = dir_ + "/.tmp.XXXXXX";  // mkostemp replaces the X's
  int fd = ::mkostemp(tmp.data(), O_CLOEXEC);
  if (fd < 0) return errnoStatus(StatusCode::kIoError, "create a temporary file in " + dir_, errno);
  {
    Fd guard(fd);
    uint32_t klen = static_cast<uint32_t>(key.size());
    Status s = writeAll(fd, &klen, sizeof(klen), tmp);
    if (s.ok()) s = writeAll(fd, key.data(), key.size(), tmp);
    if (s.ok()) s = writeAll(fd, value.data(), value.size(), tmp);
    if (!s.ok()) {
      ::unlink(tmp.c_str());
      return s;
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return errnoStatus(StatusCode::kIoError, "rename " + tmp + " -> " + path, err);
  }
  return OkStatus();
}

StatusOr<bool> FileStore::exists(std::string_view key) const {
  const std::string path = pathFor(key);
  if (::access(path.c_str(), F_OK) == 0) return true;
  // Only ENOENT means absent: a directory that became unreadable, or a file, or a failing
  // network mount is an error, not keys that will come (waits used to run to their deadline
  // blaming the keys, and check() said false).
  if (errno == ENOENT) return false;
  return errnoStatus(StatusCode::kIoError, "access " + path, errno);
}

Status FileStore::checkDirectory() const {
  // A key is absent (ENOENT) also when the directory itself is gone: then none will come.
  struct stat st {};
  if (::stat(dir_.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return OkStatus();
  return IoError(describe() + ": the store directory is gone or is not a directory");
}

template <typename Fn>
auto FileStore::withLock(Fn&& fn, Deadline callerDeadline) -> decltype(fn()) {
  std::string path = dir_ + "/.lock";
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return errnoStatus(StatusCode::kIoError, "open " + path, errno);
  Fd guard(fd);
  // Bounded like every store call: a holder that is stopped or stuck must not hang us.
  COFAB_ASSIGN_OR_RETURN(int64_t timeoutMs, storeCallTimeoutMs());
  const Deadline storeDeadline = Deadline::afterMs(timeoutMs);
  const bool callersFirst = callerDeadline.when() < storeDeadline.when();
  const Deadline deadline = storeDeadline.min(callerDeadline);
  auto pause = std::chrono::microseconds(100);
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) return errnoStatus(StatusCode::kIoError, "flock " + path, errno);
    if (deadline.expired()) {
      const std::string when =
          callersFirst ? "at the caller's deadline"
                       : "after " + std::to_string(timeoutMs) + " ms (COFAB_STORE_TIMEOUT_MS)";
      return DeadlineExceeded(describe() + ": its lock " + path + " is still held by another " +
                              "process " + when + "; is a store user stopped or stuck?");
    }
    std::this_thread::sleep_for(std::min<Duration>(pause, deadline.remaining()));
    pause = std::min(pause * 2, std::chrono::microseconds(10'000));
  }
  // Unlocked explicitly, not by the close: flock belongs to the open file, which a process
  // forked meanwhile (by another thread) shares through its copy of fd, and would keep locked
  // for as long as it lived. LOCK_UN releases it for every copy.
  auto result = fn();
  ::flock(fd, LOCK_UN);
  return result;
}

Status FileStore::set(std::string_view key, const Bytes& value) {
  return setBy(key, value, Deadline::never());  // the lock's wait: the store call timeout only
}

Status FileStore::setBy(std::string_view key, const Bytes& value, Deadline deadline) {
  COFAB_RETURN_IF_ERROR(validateStoreKey(key));
  COFAB_RETURN_IF_ERROR(validateStoreValue(value));
  // Under the lock like add() and compareSet(): their read-modify-write would otherwise write
  // back over a set that landed between their read and their write, losing it.
  return withLock([&]() -> Status { return writeKey(key, value); }, deadline);
}

StatusOr<Bytes> FileStore::get(std::string_view key, Deadline deadline) {
  COFAB_RETURN_IF_ERROR(validateStoreKey(key));
  auto pause = std::chrono::microseconds(200);
  while (true) {
    bool found = false;
    COFAB_ASSIGN_OR_RETURN(Bytes value, readKey(key, &found));
    if (found) return value;
    COFAB_RETURN_IF_ERROR(checkDirectory());  // a key of a vanished directory never comes
    if (deadline.expired()) return storeWaitTimeout(describe(), {std::string(key)});
    std::this_thread::sleep_for(std::min<Duration>(pause, deadline.remaining()));
    pause = std::min(pause * 2, std::chrono::microseconds(10'000));
  }
}

StatusOr<int64_t> FileStore::add(std::string_view key, int64_t delta) {
  COFAB_RETURN_IF_ERROR(validateStoreKey(key));
  return withLock([&]() -> StatusOr<int64_t> {
    bool found = false;
    COFAB_ASSIGN_OR_RETURN(Bytes cur, readKey(key, &found));
    COFAB_ASSIGN_OR_RETURN(int64_t value, addToCounter(key, found ? &cur : nullptr, delta));
    COFAB_RETURN_IF_ERROR(writeKey(key, toBytes(std::to_string(value))));
    return value;
  });
}

Status FileStore::wait(const std::vector<std::string>& keys, Deadline deadline) {
  for (const auto& k : keys) COFAB_RETURN_IF_ERROR(validateStoreKey(k));
  auto pause = std::chrono::microseconds(200);
  while (true) {
    std::vector<std::string> missing;
    for (const auto& k : keys) {
      COFAB_ASSIGN_OR_RETURN(bool present, exists(k));
      if (!present) missing.push_back(k);
    }
    if (missing.empty()) return OkStatus();
    COFAB_RETURN_IF_ERROR(checkDirectory());  // once per round, not per missing key
    if (deadline.expired()) return storeWaitTimeout(describe(), missing);
    std::this_thread::sleep_for(std::min<Duration>(pause, deadline.remaining()));
    pause = std::min(pause * 2, std::chrono::microseconds(10'000));
  }
}

StatusOr<Bytes> FileStore::compareSet(std::string_view key, const Bytes& expected,
                                      const Bytes& desired) {
  COFAB_RETURN_IF_ERROR(validateStoreKey(key));
  COFAB_RETURN_IF_ERROR(validateStoreValue(expected));
  COFAB_RETURN_IF_ERROR(validateStoreValue(desired));
  return withLock([&]() -> StatusOr<Bytes> {
    bool found = false;
    COFAB_ASSIGN_OR_RETURN(Bytes cur, readKey(key, &found));
    bool matches = found ? cur == expected : expected.empty();
    if (!matches) return cur;
    COFAB_RETURN_IF_ERROR(writeKey(key, desired));
    return desired;
  });
}

StatusOr<bool> FileStore::remove(std::string_view key) {
  COFAB_RETURN_IF_ERROR(validateStoreKey(key));
  // Under the lock for the same reason as set(): an add() or compareSet() in flight would
  // otherwise recreate the key it removed.
  return withLock([&]() -> StatusOr<bool> {
    std::string path = pathFor(key);
    if (::unlink(path.c_str()) == 0) return true;
    if (errno == ENOENT) return false;
    return errnoStatus(StatusCode::kIoError, "unlink " + path, errno);
  });
}

StatusOr<bool> FileStore::check(const std::vector<std::string>& keys) {
  for (const auto& k : keys) COFAB_RETURN_IF_ERROR(validateStoreKey(k));
  for (const auto& k : keys) {
    COFAB_ASSIGN_OR_RETURN(bool present, exists(k));
    if (!present) {
      COFAB_RETURN_IF_ERROR(checkDirectory());
      return false;
    }
  }
  return true;
}

}  // namespace cofab
