// Readers for the idx format of MNIST and Fashion-MNIST.
//
// Files may be gzip-compressed or plain (zlib's gzread reads both). An idx
// file is a big-endian header (magic 0x00000803 and three dimensions for
// images, 0x00000801 and one dimension for labels) followed by unsigned bytes.
// Every check failure is a value naming the file: a bad magic, a size that
// disagrees with the header ("expected N bytes, found M"), a corrupt gzip
// stream, image and label counts that differ. A file is read no further than
// its header says it holds, plus a 1 MiB look past it: a stream that
// inflates far beyond its header (a gzip bomb) is refused without being
// inflated, and a header claiming more than 4 GiB is refused at once.
//
// Threading: free functions, no shared state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace troupe::data {

inline constexpr uint32_t kIdxImagesMagic = 0x00000803;
inline constexpr uint32_t kIdxLabelsMagic = 0x00000801;
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

struct IdxImages {
  int64_t count = 0;
  int rows = 0;
  int cols = 0;
  std::vector<float> pixels;  // [count x rows*cols], byte / 255, in [0, 1]
};

// Images and their labels.
struct IdxDataset {
  int64_t count = 0;
  int rows = 0;
  int cols = 0;
  std::vector<float> images;    // [count x rows*cols] in [0, 1]
  std::vector<uint8_t> labels;  // [count]
};

struct FashionMnist {
  IdxDataset train;
  IdxDataset test;
};

// One idx3-ubyte image file.
Expected<IdxImages> readIdxImages(const std::string& path);
// One idx1-ubyte label file.
Expected<std::vector<uint8_t>> readIdxLabels(const std::string& path);
// An image file and its label file; the counts must agree.
Expected<IdxDataset> readIdxDataset(const std::string& imagesPath, const std::string& labelsPath);

// Loads DIR/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] (the gzip name
// is tried first). Default: the Debian package dataset-fashion-mnist.
Expected<FashionMnist> loadFashionMnist(const std::string& dir = kFashionMnistDir);

}  // namespace troupe::data
