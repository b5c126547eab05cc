/*
 * TEST DOUBLE: a stand-in libcuda.so.1 for hosts without an NVIDIA driver (CI, lab
 * containers). Never install it on a GPU host: it shadows the driver.
 *
 * The mooncake transfer engine's compiled modules (mooncake/engine.so and the libraries
 * beside it) link libcuda.so.1, so `import mooncake.engine` fails where the driver is
 * absent. This library exports every cu* symbol they import; each returns
 * CUDA_ERROR_NO_DEVICE (100), so the engine runs its TCP/host-memory paths and reports
 * "no device" for anything that needs a GPU. build.sh checks the list below against
 * `nm -D --undefined-only` of the installed package, so a new symbol fails the build.
 */
#define CUDA_ERROR_NO_DEVICE 100

/* The symbols as of mooncake-transfer-engine-cuda13 0.3.14; any arguments are ignored. */
#define NO_DEVICE(name) int name(void) { return CUDA_ERROR_NO_DEVICE; }
NO_DEVICE(cuCtxGetCurrent)
NO_DEVICE(cuCtxGetDevice)
NO_DEVICE(cuCtxSetCurrent)
NO_DEVICE(cuDeviceGet)
NO_DEVICE(cuDeviceGetAttribute)
NO_DEVICE(cuDeviceGetCount)
NO_DEVICE(cuDeviceGetPCIBusId)
NO_DEVICE(cuDevicePrimaryCtxRelease_v2)
NO_DEVICE(cuDevicePrimaryCtxRetain)
NO_DEVICE(cuDriverGetVersion)
NO_DEVICE(cuFuncSetAttribute)
NO_DEVICE(cuInit)
NO_DEVICE(cuLaunchKernel)
NO_DEVICE(cuLaunchKernelEx)
NO_DEVICE(cuMemAddressFree)
NO_DEVICE(cuMemAddressReserve)
NO_DEVICE(cuMemCreate)
NO_DEVICE(cuMemExportToShareableHandle)
NO_DEVICE(cuMemGetAddressRange_v2)
NO_DEVICE(cuMemGetAllocationGranularity)
NO_DEVICE(cuMemGetHandleForAddressRange)
NO_DEVICE(cuMemImportFromShareableHandle)
NO_DEVICE(cuMemMap)
NO_DEVICE(cuMemRelease)
NO_DEVICE(cuMemRetainAllocationHandle)
NO_DEVICE(cuMemSetAccess)
NO_DEVICE(cuMemUnmap)
NO_DEVICE(cuModuleGetFunction)
NO_DEVICE(cuModuleLoadDataEx)
NO_DEVICE(cuModuleUnload)
NO_DEVICE(cuPointerGetAttribute)
NO_DEVICE(cuPointerSetAttribute)

/* Callers print these strings: give them a real one instead of an unset pointer. */
int cuGetErrorName(int error, const char **name) {
    (void)error;
    *name = "CUDA_ERROR_NO_DEVICE";
    return 0;
}

int cuGetErrorString(int error, const char **text) {
    (void)error;
    *text = "no CUDA device (libcuda.so.1 is the test stub, molecule/shared/libcuda_stub)";
    return 0;
}
