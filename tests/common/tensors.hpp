// Host tensors for the numerics tests: a flashattn_tensor_t view over host bytes, in a dtype,
// with contiguous, padded, packed-QKV or batch-broadcast layouts; seeded random fill rounded to
// the dtype; conversion to contiguous doubles (the reference's input); NaN poisoning; and a
// check that nothing outside the view's elements was written. A GPU test can copy
// storage_data()/storage_bytes() to the device and use view_at(device_base).
// Depends only on the public header and core/half.hpp.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <flashattn/flashattn.h>

namespace flashattn_test {

const char* dtype_label(flashattn_dtype_t dtype);
size_t dtype_bytes(flashattn_dtype_t dtype);
// `value` rounded to the dtype (round to nearest even), widened back to double.
double round_to(flashattn_dtype_t dtype, double value);

// Copies of a HostTensor share its storage, as views do (packed_qkv relies on it).
class HostTensor {
 public:
  HostTensor() = default;

  // Contiguous [b, n, h, d].
  static HostTensor make(flashattn_dtype_t dtype, int64_t b, int64_t n, int64_t h, int64_t d);
  // [b, n, h, d] with gaps: head stride d + pad_head, seq stride h * (d + pad_head) + pad_seq,
  // batch stride n * (seq stride) + pad_batch (elements).
  static HostTensor padded(flashattn_dtype_t dtype, int64_t b, int64_t n, int64_t h, int64_t d,
                           int64_t pad_head, int64_t pad_seq, int64_t pad_batch);
  // q [b, n, hq, d], k and v [b, n, hkv, d] as slices of one [b, n, hq + 2 hkv, d] allocation.
  static std::array<HostTensor, 3> packed_qkv(flashattn_dtype_t dtype, int64_t b, int64_t n,
                                              int64_t hq, int64_t hkv, int64_t d);
  // One [n, h, d] block seen as [b, n, h, d] with batch stride 0 (an input broadcast over b).
  static HostTensor broadcast_batch(flashattn_dtype_t dtype, int64_t b, int64_t n, int64_t h,
                                    int64_t d);
  // The fp32 LSE [b, h, n], contiguous.
  static HostTensor lse(int64_t b, int64_t h, int64_t n);
  // A contiguous fp32 vector [n] or matrix [rows, cols] (ALiBi slopes, sinks, their gradient).
  static HostTensor vector(int64_t n);
  static HostTensor matrix(int64_t rows, int64_t cols);

  flashattn_dtype_t dtype() const { return dtype_; }
  int rank() const { return rank_; }
  int64_t shape(int i) const { return shape_[i]; }
  int64_t stride(int i) const { return strides_[i]; }
  int64_t numel() const;

  // Logical elements, row-major over the shape.
  std::vector<double> to_double() const;
  // Sets the logical elements (row-major), each rounded to the dtype.
  void from_double(const std::vector<double>& values);
  // Normal(mean, stddev) values from a seeded generator (splitmix64 + Box-Muller), rounded to
  // the dtype: the same seed gives the same tensor from run to run and host to host.
  void fill_normal(uint64_t seed, double mean = 0.0, double stddev = 1.0);
  // Every element NaN (outputs: whatever the call leaves unwritten shows).
  void poison();
  // For the tests of what a mask hides, in batch 0 and every head of a rank-4 tensor: +inf, NaN
  // and -inf in the first three elements of row `row` (a key of k or v), or NaN and +inf in the
  // first two elements of each of rows [0, rows).
  void set_nonfinite_row(int64_t row);
  void set_nonfinite_rows(int64_t rows);

  double get(int64_t i0, int64_t i1, int64_t i2, int64_t i3 = 0) const;
  void set(int64_t i0, int64_t i1, int64_t i2, int64_t i3, double value);  // rounds to dtype

  flashattn_tensor_t view() const;
  // The same view over a copy of the storage that starts at `base` (e.g. device memory).
  flashattn_tensor_t view_at(void* base) const;

  void* storage_data() { return storage_->data(); }
  const void* storage_data() const { return storage_->data(); }
  size_t storage_bytes() const { return storage_->size(); }
  size_t byte_offset() const { return offset_; }

  std::vector<unsigned char> snapshot() const { return *storage_; }
  // The first byte of the storage that is not part of this view's elements and differs from
  // `before`, or -1: a write outside the view.
  int64_t changed_outside(const std::vector<unsigned char>& before) const;

 private:
  static HostTensor with_layout(flashattn_dtype_t dtype, int rank, const int64_t* shape,
                                const int64_t* strides,
                                std::shared_ptr<std::vector<unsigned char>> storage, size_t offset);
  size_t byte_at(const int64_t* idx) const;
  double load(size_t byte) const;
  void store(size_t byte, double value);
  template <class F>
  void for_each(F&& f) const;  // f(index[4], logical position)

  std::shared_ptr<std::vector<unsigned char>> storage_;
  size_t offset_ = 0;
  flashattn_dtype_t dtype_ = FLASHATTN_DTYPE_FLOAT32;
  int rank_ = 4;
  int64_t shape_[4] = {1, 1, 1, 1};
  int64_t strides_[4] = {0, 0, 0, 1};
};

}  // namespace flashattn_test
