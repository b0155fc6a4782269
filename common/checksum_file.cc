#include "common/checksum_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <xxhash.h>

namespace troupe {

namespace fs = std::filesystem;

uint64_t xxh3(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

namespace {

constexpr size_t kMagicBytes = 8;
constexpr size_t kChecksumBytes = 8;

std::string errnoText() { return std::strerror(errno); }

// fsync of the directory holding `path`, so the rename is durable.
Status syncDirectory(const std::string& path) {
  const std::string dir = fs::path(path).parent_path().empty() ? "." : fs::path(path).parent_path().string();
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return Status::ioError(fmt::format("{}: cannot open its directory to sync it: {}", path, errnoText()));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return Status::ioError(fmt::format("{}: cannot sync its directory: {}", path, errnoText()));
  return Status::ok();
}

}  // namespace

Expected<ChecksumWriter> ChecksumWriter::create(const std::string& path, std::string_view magic) {
  if (magic.size() != kMagicBytes) return Status::invalidArgument("a file magic is 8 characters");
  std::FILE* f = std::fopen((path + ".tmp").c_str(), "wb");
  if (!f) return Status::ioError(fmt::format("cannot write {}: {}", path + ".tmp", errnoText()));
  std::setvbuf(f, nullptr, _IOFBF, size_t{1} << 20);
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  ChecksumWriter w(path, f, state);
  w.put(magic.data(), magic.size());
  return w;
}

ChecksumWriter::ChecksumWriter(std::string path, std::FILE* file, void* state)
    : path_(std::move(path)), file_(file), state_(state) {}

ChecksumWriter::ChecksumWriter(ChecksumWriter&& o) noexcept
    : path_(std::move(o.path_)), file_(o.file_), state_(o.state_), bytes_(o.bytes_), failed_(o.failed_) {
  o.file_ = nullptr;
  o.state_ = nullptr;
}

ChecksumWriter::~ChecksumWriter() {
  if (file_) {
    std::fclose(file_);
    std::remove((path_ + ".tmp").c_str());
  }
  if (state_) XXH3_freeState(static_cast<XXH3_state_t*>(state_));
}

void ChecksumWriter::put(const void* data, size_t bytes) {
  if (failed_ || bytes == 0) return;
  if (std::fwrite(data, 1, bytes, file_) != bytes) failed_ = true;
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, bytes);
  bytes_ += bytes;
}

void ChecksumWriter::putString(const std::string& s) {
  put(uint64_t(s.size()));
  put(s.data(), s.size());
}

Status ChecksumWriter::finish(uint64_t* checksum, uint64_t* bytes) {
  if (!file_) return Status::internal(fmt::format("{}: written already", path_));
  const uint64_t sum = XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_));
  if (!failed_ && std::fwrite(&sum, 1, sizeof sum, file_) != sizeof sum) failed_ = true;
  bytes_ += sizeof sum;
  if (!failed_ && std::fflush(file_) != 0) failed_ = true;
  if (!failed_ && ::fsync(::fileno(file_)) != 0) failed_ = true;
  const std::string error = failed_ ? errnoText() : "";
  std::fclose(file_);
  file_ = nullptr;
  const std::string tmp = path_ + ".tmp";
  if (failed_) {
    std::remove(tmp.c_str());
    return Status::ioError(fmt::format("cannot write {}: {}", tmp, error));
  }
  if (std::rename(tmp.c_str(), path_.c_str()) != 0) {
    const std::string why = errnoText();
    std::remove(tmp.c_str());
    return Status::ioError(fmt::format("cannot rename {} to {}: {}", tmp, path_, why));
  }
  if (checksum) *checksum = sum;
  if (bytes) *bytes = bytes_;
  return syncDirectory(path_);
}

Expected<ChecksumReader> ChecksumReader::open(const std::string& path, std::string_view magic) {
  ChecksumReader r;
  r.path_ = path;
  std::error_code ec;
  if (fs::exists(path, ec) && !fs::is_regular_file(path, ec)) {
    return Status::invalidArgument(fmt::format("{}: not a regular file", path));
  }
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return Status::notFound(fmt::format("{}: cannot open: {}", path, errnoText()));
  std::fseek(f, 0, SEEK_END);
  const long size = std::ftell(f);
  std::fseek(f, 0, SEEK_SET);
  if (size < 0) {
    std::fclose(f);
    return Status::ioError(fmt::format("{}: cannot read its size", path));
  }
  r.data_.resize(size_t(size));
  const size_t got = size ? std::fread(r.data_.data(), 1, size_t(size), f) : 0;
  std::fclose(f);
  if (got != size_t(size)) return Status::ioError(fmt::format("{}: read {} of {} bytes", path, got, size));
  if (r.data_.size() < kMagicBytes + kChecksumBytes) {
    return Status::corruption(fmt::format("{}: truncated ({} bytes; a checkpoint file has at least {})", path,
                                          r.data_.size(), kMagicBytes + kChecksumBytes));
  }
  if (std::string_view(r.data_.data(), kMagicBytes) != magic) {
    return Status::corruption(fmt::format("{}: not a {} file (it starts with '{}')", path, magic,
                                          std::string(r.data_.data(), kMagicBytes)));
  }
  const size_t body = r.data_.size() - kChecksumBytes;
  uint64_t stored;
  std::memcpy(&stored, r.data_.data() + body, sizeof stored);
  const uint64_t computed = XXH3_64bits(r.data_.data(), body);
  if (stored != computed) {
    return Status::corruption(fmt::format(
        "{}: checksum mismatch (stored {:016x}, computed {:016x}): the file is corrupt or truncated", path, stored,
        computed));
  }
  r.checksum_ = stored;
  r.at_ = kMagicBytes;
  r.end_ = body;
  return r;
}

Status ChecksumReader::corrupt(const char* what, const std::string& how) const {
  return Status::corruption(fmt::format("{}: {} {}", path_, what, how));
}

Status ChecksumReader::get(void* out, size_t bytes, const char* what) {
  if (bytes > left()) return corrupt(what, fmt::format("needs {} bytes, {} are left", bytes, left()));
  std::memcpy(out, data_.data() + at_, bytes);
  at_ += bytes;
  return Status::ok();
}

Status ChecksumReader::getString(std::string* out, const char* what) {
  auto n = get<uint64_t>(what);
  if (!n.hasValue()) return n.status();
  if (*n > left()) return corrupt(what, fmt::format("claims {} bytes, {} are left", *n, left()));
  out->assign(data_.data() + at_, size_t(*n));
  at_ += size_t(*n);
  return Status::ok();
}

Status ChecksumReader::finish() const {
  if (left() != 0) return corrupt("payload", fmt::format("has {} bytes nothing reads", left()));
  return Status::ok();
}

}  // namespace troupe
