// Command hostpath is the test cluster's CSI driver, hostpath.csi.agentplane.dev
// (tests/cluster/cluster.sh, docs/cluster.md "Storage"): volumes and
// snapshots are directories on this node, a snapshot or clone is a copy of
// one (cp -a), and a pod sees its volume through a bind mount. It serves the
// CSI Identity, Controller and Node services on one Unix socket, and the
// kubelet's plugin-registration service on a second one in the kubelet's
// plugins_registry directory (in place of node-driver-registrar).
//
// Single node, no capacity enforcement: a volume is a plain directory, its
// requested size is reported back and nothing more.
//
// Layout under --data-dir:
//
//	volumes/<id>/       a volume's tree (mode 0777 when new, so non-root pods write)
//	volumes/<id>.json   its name, size and source
//	snapshots/<id>/     a snapshot's tree (a copy of the volume's)
//	snapshots/<id>.json its name, source volume, size and creation time
//
// IDs derive from the names the sidecars give (sha256), so a retried create
// lands on the same object; a copy is made in a temporary directory and
// renamed into place, and the .json is written last: a tree without one is
// an unfinished create and is made again.
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

const (
	driverName    = "hostpath.csi.agentplane.dev"
	driverVersion = "0.1.0"
	// Bounds: on names the sidecars send, on the metadata files read back,
	// on /proc/self/mountinfo, on a gRPC message.
	maxNameLen    = 256
	maxMetaBytes  = 64 << 10
	maxMountinfo  = 16 << 20
	maxMsgBytes   = 4 << 20
	volumePrefix  = "vol-"
	snapshotPfx   = "snap-"
	idHexLen      = 32
	defaultSocket = "/var/lib/kubelet/plugins/" + driverName + "/csi.sock"
	defaultRegSkt = "/var/lib/kubelet/plugins_registry/" + driverName + "-reg.sock"
)

var idRE = regexp.MustCompile(`^(vol|snap)-[0-9a-f]{32}$`)

type volMeta struct {
	Name           string `json:"name"`
	CapacityBytes  int64  `json:"capacityBytes"`
	SourceSnapshot string `json:"sourceSnapshot,omitempty"`
	SourceVolume   string `json:"sourceVolume,omitempty"`
}

type snapMeta struct {
	Name         string `json:"name"`
	SourceVolume string `json:"sourceVolume"`
	SizeBytes    int64  `json:"sizeBytes"`
	CreatedNanos int64  `json:"createdUnixNanos"`
}

type driver struct {
	nodeID  string
	dataDir string
	csiSock string
	// ctrl serializes the controller's creates and deletes; node serializes
	// publish and unpublish (mount table checks and changes).
	ctrl sync.Mutex
	node sync.Mutex
}

func (d *driver) volDir(id string) string  { return filepath.Join(d.dataDir, "volumes", id) }
func (d *driver) snapDir(id string) string { return filepath.Join(d.dataDir, "snapshots", id) }

func idFor(prefix, name string) string {
	sum := sha256.Sum256([]byte(name))
	return prefix + hex.EncodeToString(sum[:])[:idHexLen]
}

func checkID(kind, prefix, id string) error {
	if id == "" {
		return status.Errorf(codes.InvalidArgument, "%s id is empty", kind)
	}
	if !idRE.MatchString(id) || !strings.HasPrefix(id, prefix) {
		return status.Errorf(codes.NotFound, "%s %q does not exist (not an id this driver makes: want %s<%d hex>)", kind, id, prefix, idHexLen)
	}
	return nil
}

func checkName(kind, name string) error {
	if name == "" {
		return status.Errorf(codes.InvalidArgument, "%s name is empty", kind)
	}
	if len(name) > maxNameLen {
		return status.Errorf(codes.InvalidArgument, "%s name is %d bytes long, more than %d", kind, len(name), maxNameLen)
	}
	return nil
}

// readMeta reads a .json written by writeMeta; (false, nil) when there is none.
func readMeta(path string, v any) (bool, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxMetaBytes+1))
	if err != nil {
		return false, fmt.Errorf("read %s: %w", path, err)
	}
	if len(b) > maxMetaBytes {
		return false, fmt.Errorf("%s is larger than %d bytes", path, maxMetaBytes)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return false, fmt.Errorf("parse %s: %w", path, err)
	}
	return true, nil
}

func writeMeta(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename %s: %w", tmp, err)
	}
	return nil
}

// exists: the tree and its .json are both there (a finished create).
func exists(dir string, meta any) (bool, error) {
	ok, err := readMeta(dir+".json", meta)
	if err != nil || !ok {
		return false, err
	}
	st, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if !st.IsDir() {
		return false, fmt.Errorf("%s is not a directory", dir)
	}
	return true, nil
}

// removeObject removes a tree, its .json and leftovers of unfinished creates.
func removeObject(dir string) error {
	if err := os.Remove(dir + ".json"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	return nil
}

// newTree makes dir (which must not exist yet) as a copy of src's tree, or
// empty with mode 0777 when src is "". The copy goes to a temporary sibling
// first and is renamed into place.
func newTree(ctx context.Context, dir, src string) error {
	if err := os.RemoveAll(dir); err != nil { // an unfinished earlier create
		return err
	}
	var rb [6]byte
	if _, err := rand.Read(rb[:]); err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(dir), ".tmp-"+filepath.Base(dir)+"-"+hex.EncodeToString(rb[:]))
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			_ = os.RemoveAll(tmp)
		}
	}()
	if src == "" {
		// Mkdir's mode is cut by the umask: set it afterwards.
		if err := os.Chmod(tmp, 0o777); err != nil {
			return err
		}
	} else {
		// -a: modes, owners, times, links, xattrs; "src/." into tmp also
		// gives tmp the source root's own mode, owner and times.
		cmd := exec.CommandContext(ctx, "cp", "-a", "--reflink=auto", "--no-target-directory", src+"/.", tmp)
		out, err := cmd.CombinedOutput()
		if err != nil {
			msg := strings.TrimSpace(string(out))
			if len(msg) > 2000 {
				msg = msg[:2000] + "..."
			}
			return fmt.Errorf("cp -a %s %s: %v: %s", src, tmp, err, msg)
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		return err
	}
	ok = true
	return nil
}

// treeBytes: the bytes of regular-file content under dir.
func treeBytes(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.Type().IsRegular() {
			info, err := e.Info()
			if err != nil {
				return err
			}
			n += info.Size()
		}
		return nil
	})
	return n, err
}

func internal(what string, err error) error {
	return status.Errorf(codes.Internal, "%s: %v", what, err)
}

// --- Identity ---------------------------------------------------------------

type identity struct {
	csi.UnimplementedIdentityServer
	d *driver
}

func (identity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: driverName, VendorVersion: driverVersion}, nil
}

func (identity) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{{
		Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{
			Type: csi.PluginCapability_Service_CONTROLLER_SERVICE,
		}},
	}}}, nil
}

func (i identity) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	for _, sub := range []string{"volumes", "snapshots"} {
		if st, err := os.Stat(filepath.Join(i.d.dataDir, sub)); err != nil || !st.IsDir() {
			return nil, status.Errorf(codes.FailedPrecondition, "data directory %s/%s is missing", i.d.dataDir, sub)
		}
	}
	return &csi.ProbeResponse{}, nil
}

// --- Controller -------------------------------------------------------------

type controller struct {
	csi.UnimplementedControllerServer
	d *driver
}

func rpcCap(t csi.ControllerServiceCapability_RPC_Type) *csi.ControllerServiceCapability {
	return &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{
		Rpc: &csi.ControllerServiceCapability_RPC{Type: t},
	}}
}

func (controller) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: []*csi.ControllerServiceCapability{
		rpcCap(csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME),
		rpcCap(csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT),
		rpcCap(csi.ControllerServiceCapability_RPC_CLONE_VOLUME),
	}}, nil
}

// checkCaps: filesystem volumes only (a directory has no block device); any
// access mode, as there is one node.
func checkCaps(caps []*csi.VolumeCapability) error {
	if len(caps) == 0 {
		return status.Error(codes.InvalidArgument, "volume capabilities are missing")
	}
	for _, c := range caps {
		if c.GetBlock() != nil {
			return status.Error(codes.InvalidArgument, "block volumes are not supported (volumes are directories): use volumeMode Filesystem")
		}
		if c.GetMount() == nil {
			return status.Error(codes.InvalidArgument, "a volume capability has no access type (want mount)")
		}
		if c.GetAccessMode() == nil || c.GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_UNKNOWN {
			return status.Error(codes.InvalidArgument, "a volume capability has no access mode")
		}
	}
	return nil
}

func requested(r *csi.CapacityRange) (int64, error) {
	req, lim := r.GetRequiredBytes(), r.GetLimitBytes()
	if req < 0 || lim < 0 {
		return 0, status.Errorf(codes.InvalidArgument, "negative capacity range (required %d, limit %d)", req, lim)
	}
	if lim > 0 && req > lim {
		return 0, status.Errorf(codes.OutOfRange, "required bytes %d exceed limit bytes %d", req, lim)
	}
	if req == 0 {
		return lim, nil
	}
	return req, nil
}

func (c controller) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	d := c.d
	if err := checkName("volume", req.GetName()); err != nil {
		return nil, err
	}
	if err := checkCaps(req.GetVolumeCapabilities()); err != nil {
		return nil, err
	}
	capBytes, err := requested(req.GetCapacityRange())
	if err != nil {
		return nil, err
	}
	want := volMeta{Name: req.GetName(), CapacityBytes: capBytes}
	src := ""
	if cs := req.GetVolumeContentSource(); cs != nil {
		switch {
		case cs.GetSnapshot() != nil:
			id := cs.GetSnapshot().GetSnapshotId()
			if err := checkID("source snapshot", snapshotPfx, id); err != nil {
				return nil, err
			}
			want.SourceSnapshot, src = id, d.snapDir(id)
		case cs.GetVolume() != nil:
			id := cs.GetVolume().GetVolumeId()
			if err := checkID("source volume", volumePrefix, id); err != nil {
				return nil, err
			}
			want.SourceVolume, src = id, d.volDir(id)
		default:
			return nil, status.Error(codes.InvalidArgument, "volume content source is neither a snapshot nor a volume")
		}
	}
	id := idFor(volumePrefix, req.GetName())
	dir := d.volDir(id)

	d.ctrl.Lock()
	defer d.ctrl.Unlock()
	var have volMeta
	ok, err := exists(dir, &have)
	if err != nil {
		return nil, internal("volume "+id, err)
	}
	if ok {
		if have != want {
			return nil, status.Errorf(codes.AlreadyExists,
				"volume %q exists as %s with capacity %d, source snapshot %q, source volume %q; asked for capacity %d, source snapshot %q, source volume %q",
				req.GetName(), id, have.CapacityBytes, have.SourceSnapshot, have.SourceVolume, want.CapacityBytes, want.SourceSnapshot, want.SourceVolume)
		}
	} else {
		if src != "" {
			var sm snapMeta
			var vm volMeta
			var found bool
			if want.SourceSnapshot != "" {
				found, err = exists(src, &sm)
			} else {
				found, err = exists(src, &vm)
			}
			if err != nil {
				return nil, internal("content source "+src, err)
			}
			if !found {
				kind, sid := "snapshot", want.SourceSnapshot
				if sid == "" {
					kind, sid = "volume", want.SourceVolume
				}
				return nil, status.Errorf(codes.NotFound, "source %s %s does not exist", kind, sid)
			}
		}
		if err := removeObject(dir); err != nil {
			return nil, internal("clear unfinished volume "+id, err)
		}
		if err := newTree(ctx, dir, src); err != nil {
			return nil, internal("create volume "+id+" ("+req.GetName()+")", err)
		}
		if err := writeMeta(dir+".json", &want); err != nil {
			_ = os.RemoveAll(dir)
			return nil, internal("create volume "+id, err)
		}
		log.Printf("created volume %s (%s) capacity=%d source=%q", id, req.GetName(), capBytes, src)
	}
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{
		VolumeId:      id,
		CapacityBytes: capBytes,
		ContentSource: req.GetVolumeContentSource(),
	}}, nil
}

func (c controller) DeleteVolume(_ context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	id := req.GetVolumeId()
	if err := checkID("volume", volumePrefix, id); err != nil {
		if status.Code(err) == codes.NotFound {
			return &csi.DeleteVolumeResponse{}, nil // nothing of ours to delete
		}
		return nil, err
	}
	c.d.ctrl.Lock()
	defer c.d.ctrl.Unlock()
	if err := removeObject(c.d.volDir(id)); err != nil {
		return nil, internal("delete volume "+id, err)
	}
	log.Printf("deleted volume %s", id)
	return &csi.DeleteVolumeResponse{}, nil
}

func (c controller) ValidateVolumeCapabilities(_ context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	id := req.GetVolumeId()
	if err := checkID("volume", volumePrefix, id); err != nil {
		return nil, err
	}
	var m volMeta
	ok, err := exists(c.d.volDir(id), &m)
	if err != nil {
		return nil, internal("volume "+id, err)
	}
	if !ok {
		return nil, status.Errorf(codes.NotFound, "volume %s does not exist", id)
	}
	if err := checkCaps(req.GetVolumeCapabilities()); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

func snapshotOf(id string, m *snapMeta) *csi.Snapshot {
	return &csi.Snapshot{
		SnapshotId:     id,
		SourceVolumeId: m.SourceVolume,
		SizeBytes:      m.SizeBytes,
		CreationTime:   timestamppb.New(time.Unix(0, m.CreatedNanos)),
		ReadyToUse:     true,
	}
}

func (c controller) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	d := c.d
	if err := checkName("snapshot", req.GetName()); err != nil {
		return nil, err
	}
	srcID := req.GetSourceVolumeId()
	if srcID == "" {
		return nil, status.Error(codes.InvalidArgument, "source volume id is empty")
	}
	if err := checkID("source volume", volumePrefix, srcID); err != nil {
		return nil, err
	}
	id := idFor(snapshotPfx, req.GetName())
	dir := d.snapDir(id)

	d.ctrl.Lock()
	defer d.ctrl.Unlock()
	var have snapMeta
	ok, err := exists(dir, &have)
	if err != nil {
		return nil, internal("snapshot "+id, err)
	}
	if ok {
		if have.SourceVolume != srcID {
			return nil, status.Errorf(codes.AlreadyExists, "snapshot %q exists as %s of volume %s, not of volume %s",
				req.GetName(), id, have.SourceVolume, srcID)
		}
		return &csi.CreateSnapshotResponse{Snapshot: snapshotOf(id, &have)}, nil
	}
	var vm volMeta
	found, err := exists(d.volDir(srcID), &vm)
	if err != nil {
		return nil, internal("source volume "+srcID, err)
	}
	if !found {
		return nil, status.Errorf(codes.NotFound, "source volume %s does not exist", srcID)
	}
	if err := removeObject(dir); err != nil {
		return nil, internal("clear unfinished snapshot "+id, err)
	}
	if err := newTree(ctx, dir, d.volDir(srcID)); err != nil {
		return nil, internal("snapshot "+id+" ("+req.GetName()+") of volume "+srcID, err)
	}
	size, err := treeBytes(dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, internal("size of snapshot "+id, err)
	}
	m := snapMeta{Name: req.GetName(), SourceVolume: srcID, SizeBytes: size, CreatedNanos: time.Now().UnixNano()}
	if err := writeMeta(dir+".json", &m); err != nil {
		_ = os.RemoveAll(dir)
		return nil, internal("snapshot "+id, err)
	}
	log.Printf("created snapshot %s (%s) of volume %s, %d bytes", id, req.GetName(), srcID, size)
	return &csi.CreateSnapshotResponse{Snapshot: snapshotOf(id, &m)}, nil
}

func (c controller) DeleteSnapshot(_ context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	id := req.GetSnapshotId()
	if err := checkID("snapshot", snapshotPfx, id); err != nil {
		if status.Code(err) == codes.NotFound {
			return &csi.DeleteSnapshotResponse{}, nil
		}
		return nil, err
	}
	c.d.ctrl.Lock()
	defer c.d.ctrl.Unlock()
	if err := removeObject(c.d.snapDir(id)); err != nil {
		return nil, internal("delete snapshot "+id, err)
	}
	log.Printf("deleted snapshot %s", id)
	return &csi.DeleteSnapshotResponse{}, nil
}

// --- Node ---------------------------------------------------------------------

type node struct {
	csi.UnimplementedNodeServer
	d *driver
}

func (n node) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: n.d.nodeID}, nil
}

func (node) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return &csi.NodeGetCapabilitiesResponse{}, nil // no STAGE_UNSTAGE_VOLUME
}

// unescapeMount undoes the octal escapes (\040 etc.) of /proc/self/mountinfo.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// isMountPoint: path is the mount point of an entry of /proc/self/mountinfo.
func isMountPoint(path string) (bool, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, maxMountinfo))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && unescapeMount(fields[4]) == path {
			return true, nil
		}
	}
	return false, sc.Err()
}

func (n node) NodePublishVolume(_ context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	id, target := req.GetVolumeId(), req.GetTargetPath()
	if err := checkID("volume", volumePrefix, id); err != nil {
		return nil, err
	}
	if target == "" || !filepath.IsAbs(target) {
		return nil, status.Errorf(codes.InvalidArgument, "target path %q is not an absolute path", target)
	}
	target = filepath.Clean(target)
	if req.GetVolumeCapability() == nil {
		return nil, status.Error(codes.InvalidArgument, "volume capability is missing")
	}
	if err := checkCaps([]*csi.VolumeCapability{req.GetVolumeCapability()}); err != nil {
		return nil, err
	}
	src := n.d.volDir(id)
	var m volMeta
	ok, err := exists(src, &m)
	if err != nil {
		return nil, internal("volume "+id, err)
	}
	if !ok {
		return nil, status.Errorf(codes.NotFound, "volume %s does not exist", id)
	}
	mode := req.GetVolumeCapability().GetAccessMode().GetMode()
	ro := req.GetReadonly() || mode == csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY ||
		mode == csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY

	n.d.node.Lock()
	defer n.d.node.Unlock()
	if err := os.MkdirAll(target, 0o750); err != nil {
		return nil, internal("create target path "+target, err)
	}
	// The mount table names mount points by their real paths.
	if real, err := filepath.EvalSymlinks(target); err == nil {
		target = real
	}
	mounted, err := isMountPoint(target)
	if err != nil {
		return nil, internal("read /proc/self/mountinfo", err)
	}
	if mounted {
		return &csi.NodePublishVolumeResponse{}, nil
	}
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		return nil, internal(fmt.Sprintf("bind-mount %s on %s", src, target), err)
	}
	if ro {
		if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			_ = unix.Unmount(target, 0)
			return nil, internal("remount "+target+" read-only", err)
		}
	}
	log.Printf("published volume %s on %s (read-only %v)", id, target, ro)
	return &csi.NodePublishVolumeResponse{}, nil
}

func (n node) NodeUnpublishVolume(_ context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	id, target := req.GetVolumeId(), req.GetTargetPath()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id is empty")
	}
	if target == "" || !filepath.IsAbs(target) {
		return nil, status.Errorf(codes.InvalidArgument, "target path %q is not an absolute path", target)
	}
	target = filepath.Clean(target)
	if real, err := filepath.EvalSymlinks(target); err == nil {
		target = real
	}
	n.d.node.Lock()
	defer n.d.node.Unlock()
	// A target mounted more than once (a retried publish that raced) is
	// unmounted until nothing is left; 16 rounds at most.
	for i := 0; i < 16; i++ {
		mounted, err := isMountPoint(target)
		if err != nil {
			return nil, internal("read /proc/self/mountinfo", err)
		}
		if !mounted {
			break
		}
		if err := unix.Unmount(target, 0); err != nil {
			return nil, internal("unmount "+target, err)
		}
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, internal("remove target path "+target, err)
	}
	log.Printf("unpublished volume %s from %s", id, target)
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// --- kubelet plugin registration ------------------------------------------------

type registration struct {
	registerapi.UnimplementedRegistrationServer
	d *driver
}

func (r registration) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              driverName,
		Endpoint:          r.d.csiSock,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

func (registration) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if !st.GetPluginRegistered() {
		log.Printf("the kubelet did not register %s: %s", driverName, st.GetError())
		os.Exit(1)
	}
	log.Printf("registered with the kubelet as %s", driverName)
	return &registerapi.RegistrationStatusResponse{}, nil
}

// --- serving ----------------------------------------------------------------------

func logCalls(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	t0 := time.Now()
	resp, err := h(ctx, req)
	method := info.FullMethod[strings.LastIndex(info.FullMethod, "/")+1:]
	switch {
	case err != nil:
		log.Printf("%s failed after %v: %v", method, time.Since(t0).Round(time.Millisecond), err)
	case method != "Probe" && method != "NodeGetCapabilities" && method != "GetPluginInfo":
		log.Printf("%s ok (%v)", method, time.Since(t0).Round(time.Millisecond))
	}
	return resp, err
}

func listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	return l, nil
}

func main() {
	host, _ := os.Hostname()
	csiSock := flag.String("csi-socket", defaultSocket, "Unix socket of the CSI Identity, Controller and Node services")
	regSock := flag.String("registration-socket", defaultRegSkt, "Unix socket of the kubelet plugin-registration service (in the kubelet's plugins_registry directory); empty: do not register")
	dataDir := flag.String("data-dir", "/var/lib/"+driverName, "directory holding the volumes and snapshots")
	nodeID := flag.String("node-id", host, "node id reported by NodeGetInfo")
	flag.Parse()
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	if *nodeID == "" {
		log.Fatal("--node-id is empty and the hostname is unknown")
	}
	if !filepath.IsAbs(*csiSock) || !filepath.IsAbs(*dataDir) || (*regSock != "" && !filepath.IsAbs(*regSock)) {
		log.Fatal("--csi-socket, --registration-socket and --data-dir must be absolute paths")
	}
	d := &driver{nodeID: *nodeID, dataDir: filepath.Clean(*dataDir), csiSock: *csiSock}
	if err := os.MkdirAll(d.dataDir, 0o700); err != nil {
		log.Fatalf("data directory: %v", err)
	}
	for _, sub := range []string{"volumes", "snapshots"} {
		dir := filepath.Join(d.dataDir, sub)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			log.Fatalf("data directory: %v", err)
		}
		// Temporary trees of creates that an earlier run did not finish.
		if tmps, err := filepath.Glob(filepath.Join(dir, ".tmp-*")); err == nil {
			for _, t := range tmps {
				_ = os.RemoveAll(t)
			}
		}
	}

	opts := []grpc.ServerOption{grpc.UnaryInterceptor(logCalls), grpc.MaxRecvMsgSize(maxMsgBytes)}
	csiSrv := grpc.NewServer(opts...)
	csi.RegisterIdentityServer(csiSrv, identity{d: d})
	csi.RegisterControllerServer(csiSrv, controller{d: d})
	csi.RegisterNodeServer(csiSrv, node{d: d})
	l, err := listen(*csiSock)
	if err != nil {
		log.Fatal(err)
	}
	errs := make(chan error, 2)
	go func() { errs <- csiSrv.Serve(l) }()
	log.Printf("%s %s serving CSI on %s (node %s, data %s)", driverName, driverVersion, *csiSock, d.nodeID, d.dataDir)

	var regSrv *grpc.Server
	if *regSock != "" {
		// The kubelet's plugin watcher finds this socket and calls GetInfo,
		// then NotifyRegistrationStatus; it then reaches the driver on csiSock.
		regSrv = grpc.NewServer(opts...)
		registerapi.RegisterRegistrationServer(regSrv, registration{d: d})
		rl, err := listen(*regSock)
		if err != nil {
			log.Fatal(err)
		}
		go func() { errs <- regSrv.Serve(rl) }()
		log.Printf("serving kubelet plugin registration on %s", *regSock)
	}

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	code := 0
	select {
	case s := <-sig:
		log.Printf("%v: stopping", s)
	case err := <-errs:
		log.Printf("server stopped: %v", err)
		code = 1
	}
	// Removing the registration socket tells the kubelet the plugin is gone.
	if regSrv != nil {
		regSrv.Stop()
		_ = os.Remove(*regSock)
	}
	csiSrv.Stop()
	_ = os.Remove(*csiSock)
	os.Exit(code)
}
