// models/weights/mapped_file.h: a read-only memory map of a whole file (internal to the readers).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace tessera {

// The bytes of one file, mapped read-only. An empty file maps to {nullptr, 0}.
class MappedFile {
 public:
  // Throws tessera::Error naming the file and the OS error.
  static std::shared_ptr<const MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  std::string path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace tessera
