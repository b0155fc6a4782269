#include "data/idx_reader.h"

#include <zlib.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace troupe::data {
namespace {

uint32_t bigEndian32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

// The most an idx file may claim to hold (4 GiB: Fashion-MNIST's largest
// file holds 47 MB), and how far past the size its header claims the reader
// looks before it stops (to say how much trailing data there is).
constexpr uint64_t kMaxIdxBytes = uint64_t{1} << 32;
constexpr size_t kTrailingLook = size_t{1} << 20;

class GzFile {
 public:
  explicit GzFile(gzFile f) : f_(f) {}
  ~GzFile() { gzclose(f_); }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;

  // Reads up to n bytes into out; fewer only at the end of the data. A read
  // error or corrupt gzip data is a value naming the file and the offset.
  Expected<size_t> read(const std::string& path, uint8_t* out, size_t n) {
    size_t got = 0;
    while (got < n) {
      const int r = gzread(f_, out + got, unsigned(std::min<size_t>(n - got, 1u << 30)));
      if (r < 0) return error(path, "read failed");
      if (r == 0) break;
      got += size_t(r);
      offset_ += uint64_t(r);
    }
    if (got < n) {
      int code = 0;
      gzerror(f_, &code);
      // A gzip stream cut short ends with Z_BUF_ERROR "unexpected end of file".
      if (code != Z_OK) return error(path, "corrupt or truncated gzip data");
    }
    return got;
  }

 private:
  Status error(const std::string& path, const char* what) {
    int code = 0;
    std::string why = gzerror(f_, &code);
    if (code == Z_ERRNO) why = std::strerror(errno);
    return Status::corruption(fmt::format("'{}': {} after {} bytes: {}", path, what, offset_, why));
  }

  gzFile f_;
  uint64_t offset_ = 0;
};

// An idx file's header and payload (gzip or plain), read no further than its
// header says it holds (plus a bounded look at any trailing data): a file
// whose stream inflates far beyond its header (a gzip bomb) is refused once
// the header's size has been read.
struct IdxFile {
  std::vector<uint32_t> shape;  // the header's dimensions
  std::vector<uint8_t> data;    // the whole file, header included
};
Expected<IdxFile> readIdx(const std::string& path, uint32_t magic, int dims) {
  errno = 0;
  gzFile raw = gzopen(path.c_str(), "rb");
  if (!raw) {
    const int err = errno;
    std::string msg = fmt::format("cannot open '{}': {}", path,
                                  err ? std::strerror(err) : "out of memory in zlib");
    return err == ENOENT ? Status::notFound(std::move(msg)) : Status::ioError(std::move(msg));
  }
  GzFile f(raw);
  gzbuffer(raw, 1 << 18);
  const size_t headerBytes = 4 * size_t(1 + dims);
  std::vector<uint8_t> data(headerBytes);
  auto got = f.read(path, data.data(), headerBytes);
  if (!got) return got.status();
  if (*got >= 4 && bigEndian32(data.data()) != magic) {
    return Status::corruption(fmt::format("'{}': bad idx magic 0x{:08x}, expected 0x{:08x} ({})",
                                          path, bigEndian32(data.data()), magic,
                                          magic == kIdxImagesMagic ? "idx3-ubyte images"
                                                                   : "idx1-ubyte labels"));
  }
  if (*got < headerBytes) {
    return Status::corruption(fmt::format(
        "'{}': truncated idx header: expected at least {} bytes, found {}", path, headerBytes, *got));
  }
  std::vector<uint32_t> shape(static_cast<size_t>(dims));
  // 128 bits: three 32-bit dimensions cannot overflow.
  unsigned __int128 payload = 1;
  for (int d = 0; d < dims; ++d) {
    shape[size_t(d)] = bigEndian32(data.data() + 4 * (1 + d));
    payload *= shape[size_t(d)];
  }
  if (payload > kMaxIdxBytes) {
    return Status::corruption(fmt::format("'{}': the idx header ({}) claims {} bytes, more than the reader takes ({})",
                                          path, fmt::join(shape, " x "),
                                          uint64_t(std::min<unsigned __int128>(payload, ~uint64_t{0})), kMaxIdxBytes));
  }
  const uint64_t expected = headerBytes + uint64_t(payload);
  // Grown as the data comes, so that a header claiming more than the file
  // holds costs no more memory than the file.
  size_t used = headerBytes;
  while (used < expected) {
    data.resize(size_t(std::min<uint64_t>(expected, std::max<uint64_t>(2 * data.size(), 1 << 20))));
    auto n = f.read(path, data.data() + used, data.size() - used);
    if (!n) return n.status();
    used += *n;
    if (used < data.size()) break;  // the end of the data
  }
  auto disagrees = [&](const std::string& found, const char* why) {
    return Status::corruption(fmt::format("'{}': size disagrees with the idx header ({}): expected {} bytes, found {} ({})",
                                          path, fmt::join(shape, " x "), expected, found, why));
  };
  if (used < expected) return disagrees(std::to_string(used), "truncated");
  std::vector<uint8_t> trailing(kTrailingLook);
  auto extra = f.read(path, trailing.data(), trailing.size());
  if (!extra) return extra.status();
  if (*extra == kTrailingLook) {
    return disagrees(fmt::format("more than {}", expected + kTrailingLook), "trailing data; the rest was not read");
  }
  if (*extra > 0) return disagrees(std::to_string(expected + *extra), "trailing data");
  data.resize(size_t(expected));
  return IdxFile{std::move(shape), std::move(data)};
}

std::string pickName(const std::string& dir, const std::string& base) {
  const std::string gz = dir + "/" + base + ".gz";
  std::error_code ec;
  if (std::filesystem::exists(gz, ec)) return gz;
  const std::string plain = dir + "/" + base;
  return std::filesystem::exists(plain, ec) ? plain : gz;
}

}  // namespace

Expected<IdxImages> readIdxImages(const std::string& path) {
  auto file = readIdx(path, kIdxImagesMagic, 3);
  if (!file) return file.status();
  IdxImages out;
  out.count = file->shape[0];
  out.rows = int(file->shape[1]);
  out.cols = int(file->shape[2]);
  const uint8_t* pixels = file->data.data() + 16;
  out.pixels.resize(file->data.size() - 16);
  for (size_t i = 0; i < out.pixels.size(); ++i) out.pixels[i] = float(pixels[i]) / 255.0f;
  return out;
}

Expected<std::vector<uint8_t>> readIdxLabels(const std::string& path) {
  auto file = readIdx(path, kIdxLabelsMagic, 1);
  if (!file) return file.status();
  return std::vector<uint8_t>(file->data.begin() + 8, file->data.end());
}

Expected<IdxDataset> readIdxDataset(const std::string& imagesPath, const std::string& labelsPath) {
  auto images = readIdxImages(imagesPath);
  if (!images) return images.status();
  auto labels = readIdxLabels(labelsPath);
  if (!labels) return labels.status();
  if (int64_t(labels->size()) != images->count) {
    return Status::corruption(fmt::format("'{}' holds {} images but '{}' holds {} labels",
                                          imagesPath, images->count, labelsPath, labels->size()));
  }
  IdxDataset out;
  out.count = images->count;
  out.rows = images->rows;
  out.cols = images->cols;
  out.images = std::move(images->pixels);
  out.labels = std::move(labels).value();
  return out;
}

Expected<FashionMnist> loadFashionMnist(const std::string& dir) {
  auto train = readIdxDataset(pickName(dir, "train-images-idx3-ubyte"),
                              pickName(dir, "train-labels-idx1-ubyte"));
  if (!train) return train.status();
  auto test = readIdxDataset(pickName(dir, "t10k-images-idx3-ubyte"),
                             pickName(dir, "t10k-labels-idx1-ubyte"));
  if (!test) return test.status();
  if (test->rows != train->rows || test->cols != train->cols) {
    return Status::corruption(fmt::format("'{}': train images are {}x{} but test images {}x{}", dir,
                                          train->rows, train->cols, test->rows, test->cols));
  }
  return FashionMnist{std::move(train).value(), std::move(test).value()};
}

}  // namespace troupe::data
