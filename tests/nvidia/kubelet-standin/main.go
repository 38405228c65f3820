// Command kubelet-standin is a small stand-in for the kubelet's side of the device-plugin
// API (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1), for tests/nvidia/k8s-by-hand.sh:
// it serves the Registration service on DIR/kubelet.sock, accepts the plugins that
// register (NVIDIA's device plugin registers one per resource), then, for each, dials
// its endpoint socket in DIR, calls GetDevicePluginOptions, reads the first ListAndWatch
// response and calls Allocate for one device id, and prints one JSON document (the
// resources, their device ids and health, the allocation responses) on stdout, then exits.
//
// It is built inside the plugin's module tree (tests/nvidia/build-k8s.sh copies it there)
// so that it uses the plugin's vendored API and gRPC, and nothing is downloaded.
//
//	kubelet-standin -dir DIR [-wait 120s] [-settle 3s] [-allocate 1]
//
// -wait bounds the wait for the first registration; -settle is how long it keeps
// accepting further registrations after the last one; -allocate is how many device ids
// (the first ones listed) each Allocate asks for (0: none).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type registration struct {
	Version      string `json:"version"`
	Endpoint     string `json:"endpoint"`
	ResourceName string `json:"resource_name"`
	Preferred    bool   `json:"get_preferred_allocation_available"`
}

type registrar struct {
	pluginapi.UnimplementedRegistrationServer
	got chan registration
}

func (r *registrar) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	reg := registration{Version: req.Version, Endpoint: req.Endpoint, ResourceName: req.ResourceName}
	if req.Options != nil {
		reg.Preferred = req.Options.GetPreferredAllocationAvailable
	}
	if req.Version != pluginapi.Version {
		return nil, fmt.Errorf("kubelet-standin: version %q, expected %q", req.Version, pluginapi.Version)
	}
	r.got <- reg
	return &pluginapi.Empty{}, nil
}

type device struct {
	ID       string  `json:"id"`
	Health   string  `json:"health"`
	NUMANode []int64 `json:"numa_nodes,omitempty"`
}

type mount struct {
	ContainerPath string `json:"container_path"`
	HostPath      string `json:"host_path"`
	ReadOnly      bool   `json:"read_only"`
}

type allocation struct {
	DeviceIDs   []string          `json:"device_ids"`
	Envs        map[string]string `json:"envs"`
	Mounts      []mount           `json:"mounts"`
	DeviceSpecs []string          `json:"device_specs,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	CDIDevices  []string          `json:"cdi_devices,omitempty"`
	Error       string            `json:"error,omitempty"`
}

type resource struct {
	Registration registration `json:"registration"`
	Options      *struct {
		PreStartRequired                bool `json:"pre_start_required"`
		GetPreferredAllocationAvailable bool `json:"get_preferred_allocation_available"`
	} `json:"options,omitempty"`
	Devices    []device    `json:"devices"`
	Count      int         `json:"count"`
	Healthy    int         `json:"healthy"`
	Allocation *allocation `json:"allocate,omitempty"`
	Error      string      `json:"error,omitempty"`
}

func main() {
	dir := flag.String("dir", "", "the device-plugin directory: kubelet.sock is served here, plugins' endpoints are here")
	wait := flag.Duration("wait", 120*time.Second, "how long to wait for the first registration")
	settle := flag.Duration("settle", 3*time.Second, "how long to wait for another registration after the last")
	nAlloc := flag.Int("allocate", 1, "device ids per Allocate (the first listed); 0: no Allocate")
	flag.Parse()
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "kubelet-standin: -dir is required")
		os.Exit(2)
	}
	sock := filepath.Join(*dir, "kubelet.sock")
	_ = os.Remove(sock)
	lis, err := net.Listen("unix", sock)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubelet-standin: %s: %v\n", sock, err)
		os.Exit(1)
	}
	server := grpc.NewServer()
	reg := &registrar{got: make(chan registration, 64)}
	pluginapi.RegisterRegistrationServer(server, reg)
	go func() { _ = server.Serve(lis) }()
	fmt.Fprintf(os.Stderr, "kubelet-standin: serving Registration on %s\n", sock)

	var regs []registration
	timer := time.NewTimer(*wait)
collect:
	for {
		select {
		case r := <-reg.got:
			fmt.Fprintf(os.Stderr, "kubelet-standin: Register %s at %s\n", r.ResourceName, r.Endpoint)
			regs = append(regs, r)
			timer.Reset(*settle)
		case <-timer.C:
			break collect
		}
	}
	server.Stop()
	_ = os.Remove(sock)
	if len(regs) == 0 {
		fmt.Fprintf(os.Stderr, "kubelet-standin: no plugin registered within %v\n", *wait)
		os.Exit(1)
	}
	sort.Slice(regs, func(i, j int) bool { return regs[i].ResourceName < regs[j].ResourceName })

	out := struct {
		Resources []resource `json:"resources"`
	}{}
	failed := false
	for _, r := range regs {
		res := query(filepath.Join(*dir, r.Endpoint), r, *nAlloc)
		if res.Error != "" || (res.Allocation != nil && res.Allocation.Error != "") {
			failed = true
		}
		out.Resources = append(out.Resources, res)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	_ = enc.Encode(out)
	if failed {
		os.Exit(1)
	}
}

// query asks one registered plugin what the kubelet would: options, the device list,
// one allocation.
func query(endpoint string, r registration, nAlloc int) resource {
	res := resource{Registration: r, Devices: []device{}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		res.Error = fmt.Sprintf("dial %s: %v", endpoint, err)
		return res
	}
	defer conn.Close()
	client := pluginapi.NewDevicePluginClient(conn)

	opts, err := client.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	if err != nil {
		res.Error = fmt.Sprintf("GetDevicePluginOptions: %v", err)
		return res
	}
	res.Options = &struct {
		PreStartRequired                bool `json:"pre_start_required"`
		GetPreferredAllocationAvailable bool `json:"get_preferred_allocation_available"`
	}{opts.PreStartRequired, opts.GetPreferredAllocationAvailable}

	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		res.Error = fmt.Sprintf("ListAndWatch: %v", err)
		return res
	}
	first, err := stream.Recv()
	if err != nil {
		res.Error = fmt.Sprintf("ListAndWatch: first response: %v", err)
		return res
	}
	var ids []string
	for _, d := range first.Devices {
		dev := device{ID: d.ID, Health: d.Health}
		if d.Topology != nil {
			for _, n := range d.Topology.Nodes {
				dev.NUMANode = append(dev.NUMANode, n.ID)
			}
		}
		res.Devices = append(res.Devices, dev)
		ids = append(ids, d.ID)
		if d.Health == pluginapi.Healthy {
			res.Healthy++
		}
	}
	res.Count = len(res.Devices)
	if nAlloc <= 0 || len(ids) == 0 {
		return res
	}
	if nAlloc > len(ids) {
		nAlloc = len(ids)
	}
	alloc := &allocation{DeviceIDs: ids[:nAlloc], Envs: map[string]string{}, Mounts: []mount{}}
	res.Allocation = alloc
	resp, err := client.Allocate(ctx, &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: alloc.DeviceIDs}},
	})
	if err != nil {
		alloc.Error = fmt.Sprintf("Allocate: %v", err)
		return res
	}
	if len(resp.ContainerResponses) != 1 {
		alloc.Error = fmt.Sprintf("Allocate: %d container responses for one request", len(resp.ContainerResponses))
		return res
	}
	c := resp.ContainerResponses[0]
	for k, v := range c.Envs {
		alloc.Envs[k] = v
	}
	for _, m := range c.Mounts {
		alloc.Mounts = append(alloc.Mounts, mount{ContainerPath: m.ContainerPath, HostPath: m.HostPath, ReadOnly: m.ReadOnly})
	}
	for _, d := range c.Devices {
		alloc.DeviceSpecs = append(alloc.DeviceSpecs, d.HostPath+":"+d.ContainerPath+":"+d.Permissions)
	}
	alloc.Annotations = c.Annotations
	for _, d := range c.CdiDevices {
		alloc.CDIDevices = append(alloc.CDIDevices, d.Name)
	}
	return res
}
