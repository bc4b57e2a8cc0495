# The base `make image-test` builds docker/Dockerfile on, where no registry is reachable: a Debian
# root file system made by mmdebstrap (imported as localhost/paratrain-debian:test), a virtual
# environment on PATH (as conda is in PyTorch's images) and the CPU build of torch.
ARG DEBIAN_IMAGE=localhost/paratrain-debian:test
FROM ${DEBIAN_IMAGE}
ARG TORCH_WHEEL
# The host's certificate authorities: package registries may be reached through a TLS proxy.
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt
COPY ${TORCH_WHEEL} /tmp/
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir "/tmp/${TORCH_WHEEL}" \
    && rm "/tmp/${TORCH_WHEEL}"
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
