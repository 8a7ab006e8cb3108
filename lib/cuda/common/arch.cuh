// FLASHATTN_SM90A_DEVICE is defined in the device passes that may use sm_90a instructions
// (wgmma, setmaxnreg). Other passes (sm_80, compute_80 PTX) compile the sm90 kernels to empty
// bodies; the dispatcher never launches them on such devices.
#pragma once

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FLASHATTN_SM90A_DEVICE 1
#endif
