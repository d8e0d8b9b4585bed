#!/usr/bin/env bash
# Builds the orion-gpu-share image (the one the Helm chart runs) without a container engine or a
# registry, from the built binaries and Debian 12 packages:
#   - the runtime root file system: mmdebstrap (minbase) with only the packages that hold the
#     shared libraries the binaries load (found with ldd + dpkg -S), plus the binaries
#     (/usr/local/bin) and the interposer (/opt/orion/lib, where orion-agent installs it from),
#     stripped of debug information, and a non-root user `orion` (65532) as the default user;
#   - an OCI image layout (umoci) with the org.opencontainers.image.* labels, tagged VERSION;
#   - a docker-archive tarball (skopeo) that `docker load`, `podman load`, `ctr images import`
#     and `kind load image-archive` accept.
# deploy/image/Containerfile builds the same content with Docker or Podman.
#
#   tools/build-image.sh [BUILD_DIR] [OUT_DIR]      (default build, BUILD_DIR/image)
#   ORION_IMAGE_REPOSITORY=registry.example/orion-gpu-share tools/build-image.sh
# Writes OUT_DIR/oci (layout), OUT_DIR/orion-gpu-share-VERSION.tar and OUT_DIR/rootfs. Needs root
# (mmdebstrap's root mode, chroot in tools/check-image.sh); installs mmdebstrap, umoci and skopeo.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$(cd "${1:-${ROOT}/build}" && pwd)"
OUT="${2:-${BUILD}/image}"
VERSION="$(head -n1 "${ROOT}/VERSION")"
REPOSITORY="${ORION_IMAGE_REPOSITORY:-ghcr.io/orion-gpu-share/orion-gpu-share}"
COMMIT="$(git -C "${ROOT}" rev-parse HEAD 2>/dev/null || echo unknown)"
BINARIES=(server/orion-server agent/orion-agent tools/orion-ctl tools/orion-run)
INTERPOSER=interpose/liborion_interpose.so

need=()
for tool in mmdebstrap umoci skopeo; do command -v "$tool" > /dev/null || need+=("$tool"); done
if ((${#need[@]})); then
  echo "installing: ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
for b in "${BINARIES[@]}" "${INTERPOSER}"; do
  [[ -f "${BUILD}/${b}" ]] || { echo "build-image: ${BUILD}/${b} is missing: build first" >&2; exit 1; }
done

# The Debian packages holding every shared library the binaries load (usrmerge: /lib is
# /usr/lib, and dpkg knows one of the two spellings).
packages=()
while read -r lib; do
  real="$(readlink -f "$lib")"
  pkg="$(dpkg -S "${real}" 2>/dev/null || dpkg -S "${real/#\/usr\/lib\//\/lib\/}" 2>/dev/null ||
         dpkg -S "${real/#\/lib\//\/usr\/lib\/}" 2>/dev/null || true)"
  pkg="${pkg%%:*}"
  [[ -n "$pkg" ]] || { echo "build-image: no Debian package holds ${real}" >&2; exit 1; }
  packages+=("$pkg")
done < <(for b in "${BINARIES[@]}"; do ldd "${BUILD}/${b}"; done | awk '/=> \// {print $3}' | sort -u)
include="$(printf '%s\n' "${packages[@]}" ca-certificates | sort -u | paste -sd, -)"
echo "runtime packages: ${include}"

rm -rf "${OUT}"
mkdir -p "${OUT}"
ROOTFS="${OUT}/rootfs"
# The host's own Debian sources when it has them (same mirror, same snapshot), else the default.
mirror=()
[[ -f /etc/apt/sources.list.d/debian.sources ]] && mirror=(/etc/apt/sources.list.d/debian.sources)
mmdebstrap --quiet --mode=root --variant=minbase --include="${include}" \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
  --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*' \
  bookworm "${ROOTFS}" "${mirror[@]}"

install -d "${ROOTFS}/usr/local/bin" "${ROOTFS}/opt/orion/lib" "${ROOTFS}/etc/orion"
for b in "${BINARIES[@]}"; do
  install -m 0755 "${BUILD}/${b}" "${ROOTFS}/usr/local/bin/"
  strip --strip-debug "${ROOTFS}/usr/local/bin/$(basename "$b")"
done
install -m 0755 "${BUILD}/${INTERPOSER}" "${ROOTFS}/opt/orion/lib/"
strip --strip-debug "${ROOTFS}/opt/orion/lib/liborion_interpose.so"
echo "orion:x:65532:65532:orion-gpu-share:/nonexistent:/usr/sbin/nologin" >> "${ROOTFS}/etc/passwd"
echo "orion:x:65532:" >> "${ROOTFS}/etc/group"
printf '%s\n' "${VERSION}" > "${ROOTFS}/etc/orion/VERSION"

# One layer: the whole root file system, numeric owners, fixed order.
LAYER="${OUT}/layer.tar"
tar --numeric-owner --sort=name -C "${ROOTFS}" -cf "${LAYER}" .
OCI="${OUT}/oci"
umoci init --layout "${OCI}"
umoci new --image "${OCI}:${VERSION}"
umoci raw add-layer --image "${OCI}:${VERSION}" "${LAYER}"
created="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
umoci config --image "${OCI}:${VERSION}" \
  --author="orion-gpu-share" --created="${created}" \
  --config.user=65532:65532 \
  --config.env=PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --config.workingdir=/ \
  --config.cmd=orion-server --config.cmd=--help \
  --config.label=org.opencontainers.image.title=orion-gpu-share \
  --config.label="org.opencontainers.image.description=orion-server, orion-agent, orion-ctl, orion-run and liborion_interpose.so" \
  --config.label=org.opencontainers.image.version="${VERSION}" \
  --config.label=org.opencontainers.image.revision="${COMMIT}" \
  --config.label=org.opencontainers.image.created="${created}" \
  --config.label=org.opencontainers.image.licenses=Apache-2.0 \
  --config.label=org.opencontainers.image.source=https://github.com/orion-gpu-share/orion-gpu-share
umoci gc --layout "${OCI}"
rm -f "${LAYER}"
ARCHIVE="${OUT}/orion-gpu-share-${VERSION}.tar"
skopeo copy --quiet "oci:${OCI}:${VERSION}" "docker-archive:${ARCHIVE}:${REPOSITORY}:${VERSION}"
echo "image ${REPOSITORY}:${VERSION}: OCI layout ${OCI}, docker-archive ${ARCHIVE}" \
     "($(du -h "${ARCHIVE}" | cut -f1))"
