# One image for every tunefleet service: migrations, roles, the coordinator, CPU (PoCL) workers
# and GPU workers. Build: `docker build -t tunefleet .` (docker compose builds it for you).
FROM python:3.11-slim

# binutils: PoCL links every kernel it compiles with the system `ld`.
RUN apt-get update \
    && apt-get install -y --no-install-recommends binutils \
    && rm -rf /var/lib/apt/lists/*

# NVIDIA's OpenCL driver is injected by the container runtime when a container asks for the
# `compute` capability (the compose `gpu` profile); this ICD file registers it with the OpenCL
# loader. Without a GPU the library is absent and the loader skips it, leaving PoCL's CPU device.
RUN mkdir -p /etc/OpenCL/vendors \
    && echo "libnvidia-opencl.so.1" > /etc/OpenCL/vendors/nvidia.icd

WORKDIR /opt/tunefleet
COPY pyproject.toml README.md ./
COPY src ./src
COPY coordinator ./coordinator
COPY worker ./worker
COPY migrations ./migrations
RUN pip install --no-cache-dir --disable-pip-version-check '.[pocl]'
COPY docker/device-workers.sh /usr/local/bin/tunefleet-device-workers

# Never run as root: a worker only needs its home for caches.
RUN useradd --create-home --uid 10001 tunefleet
USER tunefleet
ENV PYTHONUNBUFFERED=1 \
    TUNEFLEET_HOME=/home/tunefleet/.tunefleet
CMD ["tunefleet", "--help"]
