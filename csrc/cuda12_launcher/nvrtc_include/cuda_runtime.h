// NVRTC stand-in: NVRTC declares the device built-ins itself; epg_device.cuh includes this for nvcc.
#pragma once
