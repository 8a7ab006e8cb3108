#include "common/tensors.hpp"

#include <cmath>
#include <cstring>
#include <limits>

#include "core/half.hpp"

namespace flashattn_test {
namespace {

constexpr unsigned char kGapByte = 0xA7;  // storage outside the elements starts with this

// splitmix64: small, fast, and the same everywhere.
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1p-53; }  // (0, 1)
};

// The bytes a view spans from its first element to its last.
size_t span_bytes(flashattn_dtype_t dtype, int rank, const int64_t* shape, const int64_t* strides) {
  int64_t last = 0;
  for (int i = 0; i < rank; ++i) last += (shape[i] - 1) * strides[i];
  return static_cast<size_t>(last + 1) * dtype_bytes(dtype);
}

std::shared_ptr<std::vector<unsigned char>> new_storage(size_t bytes) {
  return std::make_shared<std::vector<unsigned char>>(bytes, kGapByte);
}

}  // namespace

const char* dtype_label(flashattn_dtype_t dtype) {
  switch (dtype) {
    case FLASHATTN_DTYPE_FLOAT32:
      return "float32";
    case FLASHATTN_DTYPE_FLOAT16:
      return "float16";
    case FLASHATTN_DTYPE_BFLOAT16:
      return "bfloat16";
    case FLASHATTN_DTYPE_INT32:
      return "int32";
  }
  return "unknown";
}

size_t dtype_bytes(flashattn_dtype_t dtype) { return dtype == FLASHATTN_DTYPE_FLOAT32 ? 4 : 2; }

double round_to(flashattn_dtype_t dtype, double value) {
  const float f = static_cast<float>(value);
  switch (dtype) {
    case FLASHATTN_DTYPE_FLOAT32:
      return f;
    case FLASHATTN_DTYPE_FLOAT16:
      return flashattn::fp16_to_float(flashattn::float_to_fp16(f));
    case FLASHATTN_DTYPE_BFLOAT16:
      return flashattn::bf16_to_float(flashattn::float_to_bf16(f));
    case FLASHATTN_DTYPE_INT32:
      return std::nearbyint(value);
  }
  return value;
}

HostTensor HostTensor::with_layout(flashattn_dtype_t dtype, int rank, const int64_t* shape,
                                   const int64_t* strides,
                                   std::shared_ptr<std::vector<unsigned char>> storage,
                                   size_t offset) {
  HostTensor t;
  t.dtype_ = dtype;
  t.rank_ = rank;
  for (int i = 0; i < rank; ++i) {
    t.shape_[i] = shape[i];
    t.strides_[i] = strides[i];
  }
  if (!storage) storage = new_storage(offset + span_bytes(dtype, rank, shape, strides));
  t.storage_ = std::move(storage);
  t.offset_ = offset;
  return t;
}

HostTensor HostTensor::make(flashattn_dtype_t dtype, int64_t b, int64_t n, int64_t h, int64_t d) {
  return padded(dtype, b, n, h, d, 0, 0, 0);
}

HostTensor HostTensor::padded(flashattn_dtype_t dtype, int64_t b, int64_t n, int64_t h, int64_t d,
                              int64_t pad_head, int64_t pad_seq, int64_t pad_batch) {
  const int64_t shape[4] = {b, n, h, d};
  const int64_t sh = d + pad_head;
  const int64_t ss = h * sh + pad_seq;
  const int64_t sb = n * ss + pad_batch;
  const int64_t strides[4] = {sb, ss, sh, 1};
  return with_layout(dtype, 4, shape, strides, nullptr, 0);
}

std::array<HostTensor, 3> HostTensor::packed_qkv(flashattn_dtype_t dtype, int64_t b, int64_t n,
                                                 int64_t hq, int64_t hkv, int64_t d) {
  const int64_t heads = hq + 2 * hkv;
  const int64_t strides[4] = {n * heads * d, heads * d, d, 1};
  const int64_t all[4] = {b, n, heads, d};
  auto storage = new_storage(span_bytes(dtype, 4, all, strides));
  const int64_t qshape[4] = {b, n, hq, d};
  const int64_t kshape[4] = {b, n, hkv, d};
  const size_t e = dtype_bytes(dtype);
  return {with_layout(dtype, 4, qshape, strides, storage, 0),
          with_layout(dtype, 4, kshape, strides, storage, static_cast<size_t>(hq * d) * e),
          with_layout(dtype, 4, kshape, strides, storage, static_cast<size_t>((hq + hkv) * d) * e)};
}

HostTensor HostTensor::broadcast_batch(flashattn_dtype_t dtype, int64_t b, int64_t n, int64_t h,
                                       int64_t d) {
  const int64_t shape[4] = {b, n, h, d};
  const int64_t strides[4] = {0, h * d, d, 1};
  return with_layout(dtype, 4, shape, strides, nullptr, 0);
}

HostTensor HostTensor::lse(int64_t b, int64_t h, int64_t n) {
  const int64_t shape[3] = {b, h, n};
  const int64_t strides[3] = {h * n, n, 1};
  return with_layout(FLASHATTN_DTYPE_FLOAT32, 3, shape, strides, nullptr, 0);
}

HostTensor HostTensor::vector(int64_t n) {
  const int64_t shape[1] = {n};
  const int64_t strides[1] = {1};
  return with_layout(FLASHATTN_DTYPE_FLOAT32, 1, shape, strides, nullptr, 0);
}

HostTensor HostTensor::matrix(int64_t rows, int64_t cols) {
  const int64_t shape[2] = {rows, cols};
  const int64_t strides[2] = {cols, 1};
  return with_layout(FLASHATTN_DTYPE_FLOAT32, 2, shape, strides, nullptr, 0);
}

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= shape_[i];
  return n;
}

size_t HostTensor::byte_at(const int64_t* idx) const {
  int64_t e = 0;
  for (int i = 0; i < rank_; ++i) e += idx[i] * strides_[i];
  return offset_ + static_cast<size_t>(e) * dtype_bytes(dtype_);
}

double HostTensor::load(size_t byte) const {
  const unsigned char* p = storage_->data() + byte;
  if (dtype_ == FLASHATTN_DTYPE_FLOAT32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return dtype_ == FLASHATTN_DTYPE_FLOAT16 ? flashattn::fp16_to_float(h)
                                           : flashattn::bf16_to_float(h);
}

void HostTensor::store(size_t byte, double value) {
  unsigned char* p = storage_->data() + byte;
  const float f = static_cast<float>(value);
  if (dtype_ == FLASHATTN_DTYPE_FLOAT32) {
    std::memcpy(p, &f, 4);
    return;
  }
  const uint16_t h =
      dtype_ == FLASHATTN_DTYPE_FLOAT16 ? flashattn::float_to_fp16(f) : flashattn::float_to_bf16(f);
  std::memcpy(p, &h, 2);
}

template <class F>
void HostTensor::for_each(F&& f) const {
  int64_t idx[4] = {0, 0, 0, 0};
  const int64_t n = numel();
  for (int64_t pos = 0; pos < n; ++pos) {
    f(idx, pos);
    for (int i = rank_ - 1; i >= 0; --i) {
      if (++idx[i] < shape_[i]) break;
      idx[i] = 0;
    }
  }
}

std::vector<double> HostTensor::to_double() const {
  std::vector<double> out(static_cast<size_t>(numel()));
  for_each(
      [&](const int64_t* idx, int64_t pos) { out[static_cast<size_t>(pos)] = load(byte_at(idx)); });
  return out;
}

void HostTensor::from_double(const std::vector<double>& values) {
  for_each([&](const int64_t* idx, int64_t pos) {
    store(byte_at(idx), values[static_cast<size_t>(pos)]);
  });
}

void HostTensor::fill_normal(uint64_t seed, double mean, double stddev) {
  Rng rng{seed * 0x2545F4914F6CDD1Dull + 1};
  for_each([&](const int64_t* idx, int64_t) {
    // Box-Muller, one value per pair of uniforms: simple and reproducible.
    const double u1 = rng.uniform(), u2 = rng.uniform();
    const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    store(byte_at(idx), mean + stddev * z);
  });
}

void HostTensor::poison() {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for_each([&](const int64_t* idx, int64_t) { store(byte_at(idx), nan); });
}

void HostTensor::set_nonfinite_row(int64_t row) {
  const double inf = std::numeric_limits<double>::infinity();
  for (int64_t h = 0; h < shape_[2]; ++h) {
    set(0, row, h, 0, inf);
    set(0, row, h, 1, std::numeric_limits<double>::quiet_NaN());
    set(0, row, h, 2, -inf);
  }
}

void HostTensor::set_nonfinite_rows(int64_t rows) {
  for (int64_t h = 0; h < shape_[2]; ++h)
    for (int64_t i = 0; i < rows; ++i) {
      set(0, i, h, 0, std::numeric_limits<double>::quiet_NaN());
      set(0, i, h, 1, std::numeric_limits<double>::infinity());
    }
}

double HostTensor::get(int64_t i0, int64_t i1, int64_t i2, int64_t i3) const {
  const int64_t idx[4] = {i0, i1, i2, i3};
  return load(byte_at(idx));
}

void HostTensor::set(int64_t i0, int64_t i1, int64_t i2, int64_t i3, double value) {
  const int64_t idx[4] = {i0, i1, i2, i3};
  store(byte_at(idx), value);
}

flashattn_tensor_t HostTensor::view() const {
  return view_at(const_cast<unsigned char*>(storage_->data()));
}

flashattn_tensor_t HostTensor::view_at(void* base) const {
  flashattn_tensor_t t{};
  t.data = static_cast<unsigned char*>(base) + offset_;
  t.dtype = dtype_;
  t.rank = rank_;
  for (int i = 0; i < rank_; ++i) {
    t.shape[i] = shape_[i];
    t.strides[i] = strides_[i];
  }
  return t;
}

int64_t HostTensor::changed_outside(const std::vector<unsigned char>& before) const {
  std::vector<bool> mine(storage_->size(), false);
  const size_t e = dtype_bytes(dtype_);
  for_each([&](const int64_t* idx, int64_t) {
    const size_t at = byte_at(idx);
    for (size_t i = 0; i < e; ++i) mine[at + i] = true;
  });
  for (size_t i = 0; i < storage_->size(); ++i) {
    if (!mine[i] && (*storage_)[i] != before[i]) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace flashattn_test
