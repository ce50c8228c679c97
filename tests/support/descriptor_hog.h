// Takes every file descriptor the process may still open, for tests of what a server does when
// accept() fails with EMFILE: lowers RLIMIT_NOFILE to a little above the descriptors in use and
// fills the rest with dup()s. release() (or the destructor) frees them and restores the limit.
// Descriptors needed during the test (a socket to connect with) must be made before.
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <vector>

namespace cofab::testing {

class DescriptorHog {
 public:
  DescriptorHog() {
    ok_ = ::getrlimit(RLIMIT_NOFILE, &old_) == 0;
    const int probe = ok_ ? ::dup(0) : -1;
    if (probe < 0) {
      ok_ = false;
      return;
    }
    ::close(probe);
    rlimit low = old_;
    low.rlim_cur = static_cast<rlim_t>(probe + 32);
    ok_ = ::setrlimit(RLIMIT_NOFILE, &low) == 0;
    for (int fd; ok_ && (fd = ::dup(0)) >= 0;) fds_.push_back(fd);
  }
  ~DescriptorHog() { release(); }
  DescriptorHog(const DescriptorHog&) = delete;
  DescriptorHog& operator=(const DescriptorHog&) = delete;

  // Whether the limit was lowered and the descriptors taken.
  bool ok() const { return ok_; }
  void release() {
    for (int fd : fds_) ::close(fd);
    fds_.clear();
    if (ok_) ::setrlimit(RLIMIT_NOFILE, &old_);
    ok_ = false;
  }

 private:
  bool ok_ = false;
  rlimit old_{};
  std::vector<int> fds_;
};

}  // namespace cofab::testing
