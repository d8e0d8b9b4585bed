#!/usr/bin/env bash
# Checks the image tools/build-image.sh made, as a registry and a container runtime would see it:
#   - the OCI layout: index -> manifest -> config and layers, every blob's sha256 and size as the
#     manifest says, media types, os/arch, the default user, the org.opencontainers.image.* labels;
#   - the docker-archive tarball: manifest.json with the repository:VERSION tag, its config and
#     layer files present;
#   - the image unpacked (umoci unpack, from the OCI layout, not the build's own root file
#     system): every binary starts in a chroot of it and prints VERSION, no shared library is
#     missing (ldd), orion-server accepts its own default config, the interposer loads into a
#     program there, and it needs no glibc symbol newer than 2.17.
#   tools/check-image.sh [IMAGE_DIR]      (default build/image; needs root for chroot)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
IMG="$(cd "${1:-${ROOT}/build/image}" && pwd)"
VERSION="$(head -n1 "${ROOT}/VERSION")"
REPOSITORY="${ORION_IMAGE_REPOSITORY:-ghcr.io/orion-gpu-share/orion-gpu-share}"
WORK="$(mktemp -d)"
trap 'rm -rf "${WORK}"' EXIT
fail() { echo "check-image: $*" >&2; exit 1; }

echo "== OCI layout"
python3 - "${IMG}/oci" "${VERSION}" <<'PY'
import hashlib, json, os, sys
layout, version = sys.argv[1], sys.argv[2]
def fail(msg):
    sys.exit(f"check-image: {msg}")
def blob(desc, media_type):
    if desc.get("mediaType") != media_type:
        fail(f"{desc.get('digest')}: media type {desc.get('mediaType')}, expected {media_type}")
    algo, _, hexdigest = desc["digest"].partition(":")
    path = os.path.join(layout, "blobs", algo, hexdigest)
    data = open(path, "rb").read()
    if algo != "sha256" or hashlib.sha256(data).hexdigest() != hexdigest:
        fail(f"{path}: content does not match its digest")
    if len(data) != desc["size"]:
        fail(f"{path}: {len(data)} bytes, the descriptor says {desc['size']}")
    return data
if json.load(open(os.path.join(layout, "oci-layout"))).get("imageLayoutVersion") != "1.0.0":
    fail("oci-layout is not version 1.0.0")
index = json.load(open(os.path.join(layout, "index.json")))
tagged = [m for m in index["manifests"]
          if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == version]
if len(tagged) != 1:
    fail(f"index.json has {len(tagged)} manifests tagged {version}")
manifest = json.loads(blob(tagged[0], "application/vnd.oci.image.manifest.v1+json"))
if manifest.get("schemaVersion") != 2:
    fail("manifest schemaVersion is not 2")
config = json.loads(blob(manifest["config"], "application/vnd.oci.image.config.v1+json"))
for layer in manifest["layers"]:
    blob(layer, layer["mediaType"])
    if not layer["mediaType"].startswith("application/vnd.oci.image.layer.v1.tar"):
        fail(f"layer media type {layer['mediaType']}")
if (config.get("os"), config.get("architecture")) != ("linux", "amd64"):
    fail(f"config is for {config.get('os')}/{config.get('architecture')}")
if len(config["rootfs"]["diff_ids"]) != len(manifest["layers"]):
    fail("config rootfs.diff_ids and manifest layers differ in number")
c = config["config"]
if c.get("User") != "65532:65532":
    fail(f"default user is {c.get('User')!r}, expected the non-root 65532:65532")
labels = c.get("Labels", {})
for key in ("title", "description", "version", "revision", "created", "source", "licenses"):
    if not labels.get(f"org.opencontainers.image.{key}"):
        fail(f"label org.opencontainers.image.{key} is missing")
if labels["org.opencontainers.image.version"] != version:
    fail(f"label version {labels['org.opencontainers.image.version']}, VERSION says {version}")
print(f"manifest, config and {len(manifest['layers'])} layer(s) valid; user {c['User']}; "
      f"version {version}, revision {labels['org.opencontainers.image.revision'][:12]}")
PY
skopeo inspect --raw "oci:${IMG}/oci:${VERSION}" > /dev/null || fail "skopeo cannot read the layout"

echo "== docker-archive"
ARCHIVE="${IMG}/orion-gpu-share-${VERSION}.tar"
tar -xf "${ARCHIVE}" -C "${WORK}" manifest.json
python3 - "${WORK}/manifest.json" "${ARCHIVE}" "${REPOSITORY}:${VERSION}" <<'PY'
import json, subprocess, sys
manifest, archive, tag = sys.argv[1:]
entries = json.load(open(manifest))
if len(entries) != 1 or entries[0].get("RepoTags") != [tag]:
    sys.exit(f"check-image: docker-archive manifest.json tags {[e.get('RepoTags') for e in entries]}, expected [{tag}]")
names = set(subprocess.run(["tar", "-tf", archive], capture_output=True, text=True,
                           check=True).stdout.split())
for f in [entries[0]["Config"]] + entries[0]["Layers"]:
    if f not in names:
        sys.exit(f"check-image: docker-archive lacks {f}")
print(f"{tag}: config and {len(entries[0]['Layers'])} layer(s) present (docker load format)")
PY

echo "== the unpacked image runs its binaries"
umoci unpack --image "${IMG}/oci:${VERSION}" "${WORK}/bundle" > /dev/null
RFS="${WORK}/bundle/rootfs"
grep -q '^orion:x:65532:65532:' "${RFS}/etc/passwd" || fail "no user orion (65532) in the image"
for bin in orion-server orion-agent orion-ctl orion-run; do
  out="$(chroot "${RFS}" "/usr/local/bin/${bin}" --version)" || fail "${bin} --version failed"
  [[ "${out}" == "${bin} ${VERSION} "* ]] || fail "${bin} --version printed '${out}'"
  missing="$(chroot "${RFS}" /usr/bin/ldd "/usr/local/bin/${bin}" | grep 'not found' || true)"
  [[ -z "${missing}" ]] || fail "${bin}: ${missing}"
  echo "${out}"
done
chroot "${RFS}" /usr/local/bin/orion-agent --help > /dev/null || fail "orion-agent --help failed"
chroot "${RFS}" /usr/local/bin/orion-server --print-default-config > "${RFS}/tmp/orion.yaml"
chroot "${RFS}" /usr/local/bin/orion-server --config /tmp/orion.yaml --check-config ||
  fail "orion-server rejects its own default config in the image"
chroot "${RFS}" /usr/bin/env LD_PRELOAD=/opt/orion/lib/liborion_interpose.so /bin/true ||
  fail "a program with the interposer preloaded does not start"
newest="$(objdump -T "${RFS}/opt/orion/lib/liborion_interpose.so" | grep -o 'GLIBC_[0-9.]*' |
          sort -uV | tail -n1)"
[[ "$(printf '%s\nGLIBC_2.17\n' "${newest}" | sort -V | tail -n1)" == "GLIBC_2.17" ]] ||
  fail "the interposer needs ${newest} (must load in glibc >= 2.17 containers)"
echo "interposer: loads, newest glibc symbol ${newest}"
echo "image checks passed"
