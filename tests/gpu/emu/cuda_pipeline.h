// CUDA emulator (tests only): cp.async through cuda_pipeline.h's primitives. A copy reads its
// source when it is issued, fills its destination with NaN bytes at once and lands its data
// only at the __pipeline_wait_prior that covers its group; a thread that exits with copies
// never waited for stops the test. So a read of a tile before the wait, or a copy issued into
// a buffer that other threads still read, sees NaN bytes instead of passing by the luck of the
// schedule.
#pragma once

#include <cstddef>

#include "cuda_runtime.h"

// size_and_align: 4, 8 or 16 bytes, both addresses aligned to it; the last zfill bytes of the
// destination become zeros instead of source bytes.
void __pipeline_memcpy_async(void* dst_shared, const void* src_global, size_t size_and_align,
                             size_t zfill = 0);
// Closes the running thread's current group of copies.
void __pipeline_commit();
// Lands every committed group of the running thread but the newest `prior` ones.
void __pipeline_wait_prior(size_t prior);
