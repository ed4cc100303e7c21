# Rewrites a kernels/cuda .cu file into host C++ for the CUDA emulator (cmake -P, IN and OUT):
#   kernel<<<grid, block, smem, stream>>>(args)  ->  ::emu::Launch(grid, block, smem, stream)(kernel, args)
#   extern __shared__ [__align__(n)] T name[];   ->  T* name = static_cast<T*>(::emu::DynamicShared());
# Everything else compiles as it is against the emulator's cuda_runtime.h.
file(READ ${IN} src)
string(REGEX REPLACE "([A-Za-z_][A-Za-z0-9_]*(<[^<>;]*>)?)<<<([^;]*)>>>\\("
       "::emu::Launch(\\3)(\\1, " src "${src}")
string(REGEX REPLACE "extern __shared__ (__align__\\([0-9]+\\) )?([A-Za-z0-9_]+) ([A-Za-z0-9_]+)\\[\\];"
       "\\2* \\3 = static_cast<\\2*>(::emu::DynamicShared());" src "${src}")
if(src MATCHES "<<<|extern __shared__")
  message(FATAL_ERROR "${IN}: a launch or dynamic shared array the emulator rewrite does not handle")
endif()
file(WRITE ${OUT} "#line 1 \"${IN}\"\n${src}")
