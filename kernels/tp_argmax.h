// kernels/tp_argmax.h: greedy sampling under tensor parallelism without gathering the logits
// (issue 17). Each rank holds the LM head's slice of the vocabulary ([rows][slice] logits, rank
// q's columns are the model's [q slice, q slice + slice)). Instead of all-gathering every
// rank's slice into whole rows (rows x vocabulary x 4 bytes a rank: 128 MiB at 128 rows on the
// 12B's 262144-entry vocabulary), each rank reduces its slice to one (value, index) pair a row
// (argmax, ops.h), the pairs are all-gathered (8 bytes a row a rank), and every rank combines
// them into the same ids: the largest value, the lowest model index on ties, NaN never wins,
// 0 for a row with no value that is not NaN (ops.h argmax's contract on the whole row).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/ops.h"

namespace twinstep::kernels {

class TpComm;

// Every rank of `comm` calls it with its slice of the same logits rows (a collective): out[r] =
// the model's greedy id of row r, on every rank. Scratch on this rank's GPU: pairs 2 rows
// floats, idx rows int32, gathered comm.ranks() x 2 rows floats.
KernelStatus tp_greedy_argmax(const float* slice, int32_t rows, int32_t slice_cols, TpComm& comm,
                              float* pairs, int32_t* idx, float* gathered, int32_t* out,
                              cudaStream_t stream);

// pairs[2 r] = slice[r, idx[r]], pairs[2 r + 1] = idx[r] (exact as a float: idx < 2^24), for
// r < rows; slice: [rows][slice_cols] fp32, idx: the rows' argmax over the slice.
KernelStatus tp_argmax_pack(const float* slice, const int32_t* idx, float* pairs, int32_t rows,
                            int32_t slice_cols, cudaStream_t stream);

// out[r] = the model index of the best of the ranks' pairs of row r: gathered is [ranks][rows][2]
// (all_gather of every rank's tp_argmax_pack), rank q's index offset q * slice_cols.
KernelStatus tp_argmax_combine(const float* gathered, int32_t* out, int32_t rows, int32_t ranks,
                               int32_t slice_cols, cudaStream_t stream);

}  // namespace twinstep::kernels
