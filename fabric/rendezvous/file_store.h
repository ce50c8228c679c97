// FileStore: a Store shared by the processes of one host through a directory.
//
// Each key is one file; writes go to a temporary file that is then renamed, so a reader sees
// either the old or the new value, never a torn one. Writers (set, add, compareSet, remove)
// serialise through flock() on a lock file in the directory, so that a read-modify-write never
// loses a concurrent set or remove; readers need no lock. Waiting polls with a short backoff
// (no inotify: the directory may be on a filesystem that does not deliver events). Safe from
// any thread and any number of processes.
#pragma once

#include <memory>
#include <string>

#include "fabric/rendezvous/store.h"

namespace cofab {

class FileStore final : public Store {
 public:
  // Creates the directory if needed. InvalidArgument for a relative path, IoError otherwise.
  static StatusOr<std::unique_ptr<FileStore>> open(const std::string& dir);

  Status set(std::string_view key, const Bytes& value) override;
  // set() whose wait for the directory's lock also ends at `deadline` (a holder that is stopped
  // must not delay a collective's failure report by the whole store timeout).
  Status setBy(std::string_view key, const Bytes& value, Deadline deadline) override;
  StatusOr<Bytes> get(std::string_view key, Deadline deadline) override;
  StatusOr<int64_t> add(std::string_view key, int64_t delta) override;
  Status wait(const std::vector<std::string>& keys, Deadline deadline) override;
  StatusOr<Bytes> compareSet(std::string_view key, const Bytes& expected,
                             const Bytes& desired) override;
  StatusOr<bool> remove(std::string_view key) override;
  StatusOr<bool> check(const std::vector<std::string>& keys) override;
  std::string describe() const override { return "file://" + dir_; }

 private:
  explicit FileStore(std::string dir) : dir_(std::move(dir)) {}

  std::string pathFor(std::string_view key) const;
  // Reads the value of key: NotFound is reported as ok=false in *found.
  StatusOr<Bytes> readKey(std::string_view key, bool* found) const;
  Status writeKey(std::string_view key, const Bytes& value);
  // Whether key exists; IoError for anything but its absence.
  StatusOr<bool> exists(std::string_view key) const;
  // IoError when the store directory is gone or is no directory (keys then read as absent).
  Status checkDirectory() const;
  // Runs fn while holding the directory's exclusive flock, waited for until the store's call
  // timeout or `deadline`, whichever comes first.
  template <typename Fn>
  auto withLock(Fn&& fn, Deadline deadline = Deadline::never()) -> decltype(fn());

  std::string dir_;
};

}  // namespace cofab
