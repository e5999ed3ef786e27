// How custom_ops_executor_runner reads a program: each piece the runtime asks for (the program's FlatBuffers data, a
// segment of constants, a delegate's payload) is read from the file into memory the loader owns, as ExecuTorch's
// FileDataLoader does, on cache lines; but a piece of 2 MiB or more goes on memory aligned to 2 MiB and advised for
// transparent huge pages (Linux). A decode step streams every weight once: on 4 KiB pages each page costs a TLB miss
// and stops the hardware prefetcher at its end (one core read 241 MiB at 16 GB/s on 4 KiB pages, 30 on 2 MiB pages;
// Gemma 3 270M's Q4_K_M program decoded 84 tokens/s, then 98, on the 2-core AMD EPYC). A hint only: where the system
// gives no huge pages, the pages stay small and nothing else changes.
//
// A named data file (.ptd) is read whole instead (`whole`): ExecuTorch asks for it a tensor at a time, and a piece of
// its own per tensor would round each up to its pages (0.1 GiB more than the file at Llama 3.2 1B's shape); the
// pieces are then views of the one copy.
#pragma once

#include <executorch/runtime/core/data_loader.h>
#include <executorch/runtime/core/error.h>
#include <executorch/runtime/core/freeable_buffer.h>
#include <executorch/runtime/core/result.h>
#include <executorch/runtime/platform/log.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace custom_ops_runner {

class FileSegmentLoader final : public executorch::runtime::DataLoader {
 public:
  static constexpr size_t kCacheLine = 64;
  static constexpr size_t kHugePage = size_t(2) << 20;

  // `whole`: read the file once, at once, and answer every load with a view of that copy.
  static executorch::runtime::Result<FileSegmentLoader> from(const char* path, bool whole = false) {
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      ET_LOG(Error, "cannot open %s: errno %d", path, errno);
      return executorch::runtime::Error::AccessFailed;
    }
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ET_LOG(Error, "%s is not a regular file", path);
      ::close(fd);
      return executorch::runtime::Error::AccessFailed;
    }
    FileSegmentLoader loader(fd, static_cast<size_t>(st.st_size));
    if (whole && loader.size_ > 0) {
      loader.whole_ = allocate(loader.size_);
      if (loader.whole_ == nullptr) {
        ET_LOG(Error, "cannot allocate %zu bytes for %s", loader.size_, path);
        return executorch::runtime::Error::MemoryAllocationFailed;
      }
      if (auto err = loader.read(0, loader.size_, loader.whole_); err != executorch::runtime::Error::Ok) {
        return err;
      }
    }
    return loader;
  }

  FileSegmentLoader(FileSegmentLoader&& other) noexcept
      : fd_(std::exchange(other.fd_, -1)), size_(other.size_), whole_(std::exchange(other.whole_, nullptr)) {}
  FileSegmentLoader(const FileSegmentLoader&) = delete;
  FileSegmentLoader& operator=(const FileSegmentLoader&) = delete;
  FileSegmentLoader& operator=(FileSegmentLoader&&) = delete;
  ~FileSegmentLoader() override {
    if (fd_ >= 0) {
      ::close(fd_);
    }
    std::free(whole_);
  }

  ET_NODISCARD executorch::runtime::Result<executorch::runtime::FreeableBuffer> load(
      size_t offset, size_t size, const SegmentInfo& /*segment_info*/) const override {
    if (auto err = bounds_error(offset, size); err != executorch::runtime::Error::Ok) {
      return err;
    }
    if (size == 0) {
      return executorch::runtime::FreeableBuffer(nullptr, 0, nullptr);
    }
    if (whole_ != nullptr) {
      return executorch::runtime::FreeableBuffer(static_cast<const char*>(whole_) + offset, size, nullptr);
    }
    void* data = allocate(size);
    if (data == nullptr) {
      ET_LOG(Error, "cannot allocate %zu bytes for the program's data at offset %zu", size, offset);
      return executorch::runtime::Error::MemoryAllocationFailed;
    }
    if (auto err = read(offset, size, data); err != executorch::runtime::Error::Ok) {
      std::free(data);
      return err;
    }
    return executorch::runtime::FreeableBuffer(data, size, [](void*, void* p, size_t) { std::free(p); });
  }

  ET_NODISCARD executorch::runtime::Error load_into(size_t offset, size_t size, const SegmentInfo& /*segment_info*/,
                                                    void* buffer) const override {
    if (auto err = bounds_error(offset, size); err != executorch::runtime::Error::Ok) {
      return err;
    }
    if (size != 0 && whole_ != nullptr) {
      std::memcpy(buffer, static_cast<const char*>(whole_) + offset, size);
      return executorch::runtime::Error::Ok;
    }
    return size == 0 ? executorch::runtime::Error::Ok : read(offset, size, buffer);
  }

  ET_NODISCARD executorch::runtime::Result<size_t> size() const override { return size_; }

 private:
  FileSegmentLoader(int fd, size_t size) : fd_(fd), size_(size) {}

  executorch::runtime::Error bounds_error(size_t offset, size_t size) const {
    if (offset > size_ || size > size_ - offset) {
      ET_LOG(Error, "%zu bytes at offset %zu are past the end of the %zu-byte file", size, offset, size_);
      return executorch::runtime::Error::InvalidArgument;
    }
    return executorch::runtime::Error::Ok;
  }

  static void* allocate(size_t size) {
    const size_t alignment = size >= kHugePage ? kHugePage : kCacheLine;
    const size_t rounded = (size + alignment - 1) / alignment * alignment;
    void* data = nullptr;
    if (::posix_memalign(&data, alignment, rounded) != 0) {
      return nullptr;
    }
#if defined(MADV_HUGEPAGE)
    if (alignment == kHugePage) {
      ::madvise(data, rounded, MADV_HUGEPAGE);  // before the read touches it
    }
#endif
    return data;
  }

  executorch::runtime::Error read(size_t offset, size_t size, void* into) const {
    auto* at = static_cast<char*>(into);
    while (size > 0) {
      const ssize_t got = ::pread(fd_, at, std::min<size_t>(size, size_t(1) << 30), static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) {
        continue;
      }
      if (got <= 0) {
        ET_LOG(Error, "reading %zu bytes at offset %zu failed: %s", size, offset,
               got == 0 ? "the file ended early (changed while the program was loaded?)" : "read error");
        return executorch::runtime::Error::AccessFailed;
      }
      at += got;
      offset += static_cast<size_t>(got);
      size -= static_cast<size_t>(got);
    }
    return executorch::runtime::Error::Ok;
  }

  int fd_;
  size_t size_;
  void* whole_ = nullptr;  // the whole file, when read whole
};

}  // namespace custom_ops_runner
