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

// The whole decompressed content of a file (gzip or plain).
Expected<std::vector<uint8_t>> readAll(const std::string& path) {
  errno = 0;
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) {
    const int err = errno;
    std::string msg = fmt::format("cannot open '{}': {}", path,
                                  err ? std::strerror(err) : "out of memory in zlib");
    return err == ENOENT ? Status::notFound(std::move(msg)) : Status::ioError(std::move(msg));
  }
  gzbuffer(f, 1 << 18);
  std::vector<uint8_t> data;
  size_t used = 0;
  for (;;) {
    if (data.size() - used < (1 << 20)) data.resize(std::max<size_t>(2 * data.size(), 1 << 21));
    const unsigned want = unsigned(std::min<size_t>(data.size() - used, 1u << 30));
    const int n = gzread(f, data.data() + used, want);
    if (n < 0) {
      int code = 0;
      std::string what = gzerror(f, &code);
      if (code == Z_ERRNO) what = std::strerror(errno);
      gzclose(f);
      return Status::corruption(
          fmt::format("'{}': read failed after {} bytes: {}", path, used, what));
    }
    if (n == 0) break;
    used += size_t(n);
  }
  int code = 0;
  const char* what = gzerror(f, &code);
  if (code != Z_OK) {
    // A gzip stream cut short ends with Z_BUF_ERROR "unexpected end of file".
    std::string msg =
        fmt::format("'{}': corrupt or truncated gzip data after {} bytes: {}", path, used, what);
    gzclose(f);
    return Status::corruption(std::move(msg));
  }
  gzclose(f);
  data.resize(used);
  return data;
}

uint32_t bigEndian32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

// Checks magic and size; returns the dimensions.
Expected<std::vector<uint32_t>> checkHeader(const std::string& path, const std::vector<uint8_t>& data,
                                            uint32_t magic, int dims) {
  const size_t headerBytes = 4 * size_t(1 + dims);
  if (data.size() >= 4 && bigEndian32(data.data()) != magic) {
    return Status::corruption(fmt::format("'{}': bad idx magic 0x{:08x}, expected 0x{:08x} ({})",
                                          path, bigEndian32(data.data()), magic,
                                          magic == kIdxImagesMagic ? "idx3-ubyte images"
                                                                   : "idx1-ubyte labels"));
  }
  if (data.size() < headerBytes) {
    return Status::corruption(fmt::format(
        "'{}': truncated idx header: expected at least {} bytes, found {}", path, headerBytes,
        data.size()));
  }
  std::vector<uint32_t> shape(static_cast<size_t>(dims));
  // 128 bits: three 32-bit dimensions cannot overflow.
  unsigned __int128 expected = headerBytes;
  unsigned __int128 payload = 1;
  for (int d = 0; d < dims; ++d) {
    shape[size_t(d)] = bigEndian32(data.data() + 4 * (1 + d));
    payload *= shape[size_t(d)];
  }
  expected += payload;
  if (data.size() != expected) {
    return Status::corruption(fmt::format(
        "'{}': size disagrees with the idx header ({}): expected {} bytes, found {}{}", path,
        fmt::join(shape, " x "), uint64_t(std::min<unsigned __int128>(expected, ~uint64_t{0})),
        data.size(),
        data.size() < expected ? " (truncated)" : " (trailing data)"));
  }
  return shape;
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
  auto data = readAll(path);
  if (!data) return data.status();
  auto shape = checkHeader(path, *data, kIdxImagesMagic, 3);
  if (!shape) return shape.status();
  IdxImages out;
  out.count = (*shape)[0];
  out.rows = int((*shape)[1]);
  out.cols = int((*shape)[2]);
  const uint8_t* pixels = data->data() + 16;
  out.pixels.resize(data->size() - 16);
  for (size_t i = 0; i < out.pixels.size(); ++i) out.pixels[i] = float(pixels[i]) / 255.0f;
  return out;
}

Expected<std::vector<uint8_t>> readIdxLabels(const std::string& path) {
  auto data = readAll(path);
  if (!data) return data.status();
  auto shape = checkHeader(path, *data, kIdxLabelsMagic, 1);
  if (!shape) return shape.status();
  return std::vector<uint8_t>(data->begin() + 8, data->end());
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
