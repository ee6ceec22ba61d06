/*
 * dma_map_ref: the reference dmaprof's untraced map times are checked against.
 *
 * It does what vfio_dma_mapping_perf_test does for vfio_type1_iommu_anonymous with no
 * prefault, and nothing else: a VFIO type1 container with the device's group, then per
 * iteration mmap an anonymous buffer, time VFIO_IOMMU_MAP_DMA and VFIO_IOMMU_UNMAP_DMA with
 * CLOCK_MONOTONIC, munmap. One warm-up iteration is discarded, as dmaprof does.
 *
 * usage: dma_map_ref BDF SIZE_BYTES ITERATIONS
 * prints one line per iteration: "map_ns <n> unmap_ns <n>"; exit 0, or 1 with the failing step.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/vfio.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static void die(const char *step)
{
	fprintf(stderr, "dma_map_ref: %s: %s\n", step, strerror(errno));
	exit(1);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static int group_of(const char *bdf)
{
	char link[512], path[256];
	ssize_t n;
	char *slash;

	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/iommu_group", bdf);
	n = readlink(path, link, sizeof(link) - 1);
	if (n < 0)
		die("readlink iommu_group");
	link[n] = 0;
	slash = strrchr(link, '/');
	return atoi(slash ? slash + 1 : link);
}

static int open_container(const char *bdf)
{
	struct vfio_group_status status = { .argsz = sizeof(status) };
	char path[64];
	int container, group;

	container = open("/dev/vfio/vfio", O_RDWR);
	if (container < 0)
		die("open /dev/vfio/vfio");
	snprintf(path, sizeof(path), "/dev/vfio/%d", group_of(bdf));
	group = open(path, O_RDWR);
	if (group < 0)
		die("open group");
	if (ioctl(group, VFIO_GROUP_GET_STATUS, &status) || !(status.flags & VFIO_GROUP_FLAGS_VIABLE))
		die("group not viable");
	if (ioctl(group, VFIO_GROUP_SET_CONTAINER, &container))
		die("VFIO_GROUP_SET_CONTAINER");
	if (ioctl(container, VFIO_SET_IOMMU, VFIO_TYPE1_IOMMU))
		die("VFIO_SET_IOMMU");
	/* As the selftests do: open the device too. */
	if (ioctl(group, VFIO_GROUP_GET_DEVICE_FD, bdf) < 0)
		die("VFIO_GROUP_GET_DEVICE_FD");
	return container;
}

static void iteration(int container, uint64_t size, uint64_t iova, int print)
{
	struct vfio_iommu_type1_dma_map map = {
		.argsz = sizeof(map),
		.flags = VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE,
		.iova = iova,
		.size = size,
	};
	struct vfio_iommu_type1_dma_unmap unmap = {
		.argsz = sizeof(unmap),
		.iova = iova,
		.size = size,
	};
	uint64_t t0, t1, t2;
	void *buf;

	buf = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED)
		die("mmap");
	map.vaddr = (uintptr_t)buf;
	t0 = now_ns();
	if (ioctl(container, VFIO_IOMMU_MAP_DMA, &map))
		die("VFIO_IOMMU_MAP_DMA");
	t1 = now_ns();
	if (ioctl(container, VFIO_IOMMU_UNMAP_DMA, &unmap) || unmap.size != size)
		die("VFIO_IOMMU_UNMAP_DMA");
	t2 = now_ns();
	if (munmap(buf, size))
		die("munmap");
	if (print)
		printf("map_ns %llu unmap_ns %llu\n", (unsigned long long)(t1 - t0),
		       (unsigned long long)(t2 - t1));
}

int main(int argc, char **argv)
{
	uint64_t size, iova;
	int container, n, i;

	if (argc != 4) {
		fprintf(stderr, "usage: dma_map_ref BDF SIZE_BYTES ITERATIONS\n");
		return 2;
	}
	size = strtoull(argv[2], NULL, 0);
	n = atoi(argv[3]);
	container = open_container(argv[1]);
	/* Aligned to the size (at least 4 GiB up), as dmaprof picks its IOVA. */
	iova = size > (1ull << 32) ? size : 1ull << 32;
	iteration(container, size, iova, 0);
	for (i = 0; i < n; i++)
		iteration(container, size, iova, 1);
	return 0;
}
