/* crucible's I/O test guest, entered through the Linux 64-bit boot protocol (long mode, the
 * first GiB identity-mapped). Unlike guest64.S, which only probes the virtio-mmio windows, it
 * drives the devices the way a driver does, so every device path of the VMM runs:
 *
 *   - virtio-block (window 1): writes sector 1, flushes, reads it back, and reads sector 0,
 *     which the host filled with HOST_SECTOR0;
 *   - virtio-console (window 0): sends CONSOLE_LINE on the transmit queue; with `io_guest.echo`
 *     on the command line it then reads one line from the receive queue (64-byte buffers, one
 *     at a time) and sends it back after "test-guest: echo: ";
 *   - virtio-vsock (window 2): connects to host port 7000 (the VMM connects `<uds>_7000`),
 *     sends GUEST_PING, waits for HOST_PONG, then shuts the connection down.
 *
 * Rings are polled (interrupts stay off). Each step prints on the serial port; a failed check
 * prints "test-guest: FAIL <letter>" and triple-faults (ud2 with an empty IDT). At the end it
 * writes the boot-complete marker and resets through the i8042 or, with `io_guest.stay` on the
 * command line, says "test-guest: staying" and halts with its devices live (for measuring the
 * VMM while it runs).
 *
 * Rebuild (the .bin is what the test loads):
 *   gcc -O2 -Wall -Wextra -m64 -ffreestanding -fno-pic -fno-pie -mno-red-zone -mgeneral-regs-only \
 *       -fno-stack-protector -fno-asynchronous-unwind-tables -fno-toplevel-reorder \
 *       -fno-reorder-functions -fno-tree-loop-distribute-patterns -c -o io.o io_guest.c
 *   ld -Ttext=0x100000 -z noseparate-code -e _start --oformat binary -o io_guest.bin io.o
 */

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long u64;

/* First in .text (-fno-toplevel-reorder): the entry at the load address. */
__asm__(".text\n"
        ".globl _start\n"
        "_start:\n"
        "    mov $0x80000, %rsp\n"
        "    mov %rsi, %rdi\n" /* the zero page */
        "    call guest_main\n"
        "1:  hlt\n"
        "    jmp 1b\n");

#define HOST_SECTOR0 "crucible host sector 0"
#define GUEST_SECTOR1 "crucible guest sector 1"
#define CONSOLE_LINE "test-guest: hello on hvc0\n"
#define GUEST_PING "ping from the guest"
#define HOST_PONG "pong from the host"
#define VSOCK_HOST_PORT 7000
#define VSOCK_GUEST_PORT 5000

/* virtio-mmio registers (version 2). */
#define MAGIC 0x000
#define DEVICE_ID 0x008
#define DEVICE_FEATURES 0x010
#define DEVICE_FEATURES_SEL 0x014
#define DRIVER_FEATURES 0x020
#define DRIVER_FEATURES_SEL 0x024
#define QUEUE_SEL 0x030
#define QUEUE_NUM_MAX 0x034
#define QUEUE_NUM 0x038
#define QUEUE_READY 0x044
#define QUEUE_NOTIFY 0x050
#define STATUS 0x070
#define QUEUE_DESC 0x080
#define QUEUE_DRIVER 0x090
#define QUEUE_DEVICE 0x0a0
#define S_ACK 1
#define S_DRIVER 2
#define S_DRIVER_OK 4
#define S_FEATURES_OK 8

#define QSIZE 8
#define F_NEXT 1
#define F_WRITE 2

static inline void outb(u16 port, u8 v) { __asm__ volatile("outb %0, %1" ::"a"(v), "Nd"(port)); }

static void puts(const char *s) {
    while (*s)
        outb(0x3f8, (u8)*s++);
}

static void fail(char what) {
    puts("test-guest: FAIL ");
    outb(0x3f8, (u8)what);
    outb(0x3f8, '\n');
    __asm__ volatile("ud2");
    for (;;)
        ;
}

static void copy(volatile u8 *to, const char *from, u32 n) {
    for (u32 i = 0; i < n; i++)
        to[i] = (u8)from[i];
}

static u32 len(const char *s) {
    u32 n = 0;
    while (s[n])
        n++;
    return n;
}

static int same(volatile const u8 *a, const char *b, u32 n) {
    for (u32 i = 0; i < n; i++)
        if (a[i] != (u8)b[i])
            return 0;
    return 1;
}

static void zero(volatile u8 *p, u32 n) {
    for (u32 i = 0; i < n; i++)
        p[i] = 0;
}

static u32 rd(u64 base, u32 reg) { return *(volatile u32 *)(base + reg); }
static void wr(u64 base, u32 reg, u32 v) { *(volatile u32 *)(base + reg) = v; }

struct desc {
    u64 addr;
    u32 len;
    u16 flags;
    u16 next;
};

struct vq {
    u64 window;
    u32 index;
    volatile struct desc *desc;
    volatile u16 *avail; /* flags, idx, ring[QSIZE] */
    volatile u16 *used;  /* flags, idx, then {u32 id, u32 len}[QSIZE] */
    u16 avail_idx;
    u16 used_seen;
};

/* Rings at `at` (desc), `at + 0x1000` (avail), `at + 0x2000` (used). */
static void vq_init(struct vq *q, u64 window, u32 index, u64 at) {
    q->window = window;
    q->index = index;
    q->desc = (volatile struct desc *)at;
    q->avail = (volatile u16 *)(at + 0x1000);
    q->used = (volatile u16 *)(at + 0x2000);
    q->avail_idx = 0;
    q->used_seen = 0;
    zero((volatile u8 *)at, 0x3000);
    wr(window, QUEUE_SEL, index);
    if (rd(window, QUEUE_NUM_MAX) < QSIZE)
        fail('Q');
    wr(window, QUEUE_NUM, QSIZE);
    wr(window, QUEUE_DESC, (u32)at);
    wr(window, QUEUE_DESC + 4, 0);
    wr(window, QUEUE_DRIVER, (u32)(at + 0x1000));
    wr(window, QUEUE_DRIVER + 4, 0);
    wr(window, QUEUE_DEVICE, (u32)(at + 0x2000));
    wr(window, QUEUE_DEVICE + 4, 0);
    wr(window, QUEUE_READY, 1);
}

/* Offers the chain starting at descriptor `head` to the device. */
static void vq_offer(struct vq *q, u16 head) {
    q->avail[2 + q->avail_idx % QSIZE] = head;
    __asm__ volatile("mfence" ::: "memory");
    q->avail_idx++;
    q->avail[1] = q->avail_idx;
    __asm__ volatile("mfence" ::: "memory");
}

static void vq_notify(struct vq *q) { wr(q->window, QUEUE_NOTIFY, q->index); }

/* Waits for the next used element; returns its descriptor id, `*written` its length. */
static u32 vq_wait_used(struct vq *q, u32 *written, char what) {
    for (u64 spins = 0; q->used[1] == q->used_seen; spins++) {
        if (spins > 2000000000UL)
            fail(what);
        __asm__ volatile("pause");
    }
    volatile u32 *elem = (volatile u32 *)(q->used + 2) + 2 * (q->used_seen % QSIZE);
    q->used_seen++;
    *written = elem[1];
    return elem[0];
}

static void set_desc(struct vq *q, u16 i, u64 addr, u32 n, u16 flags, u16 next) {
    q->desc[i].addr = addr;
    q->desc[i].len = n;
    q->desc[i].flags = flags;
    q->desc[i].next = next;
}

/* Status, features (all offered ones acknowledged), then `nqueues` queues at `rings`. */
static void device_init(u64 window, u32 id, struct vq *queues, u32 nqueues, u64 rings,
                        char what) {
    if (rd(window, MAGIC) != 0x74726976 || rd(window, DEVICE_ID) != id)
        fail(what);
    wr(window, STATUS, 0);
    wr(window, STATUS, S_ACK);
    wr(window, STATUS, S_ACK | S_DRIVER);
    for (u32 sel = 0; sel < 2; sel++) {
        wr(window, DEVICE_FEATURES_SEL, sel);
        u32 offered = rd(window, DEVICE_FEATURES);
        wr(window, DRIVER_FEATURES_SEL, sel);
        wr(window, DRIVER_FEATURES, offered);
    }
    wr(window, STATUS, S_ACK | S_DRIVER | S_FEATURES_OK);
    if (!(rd(window, STATUS) & S_FEATURES_OK))
        fail(what);
    for (u32 i = 0; i < nqueues; i++)
        vq_init(&queues[i], window, i, rings + i * 0x4000);
    wr(window, STATUS, S_ACK | S_DRIVER | S_FEATURES_OK | S_DRIVER_OK);
    if (rd(window, STATUS) != (S_ACK | S_DRIVER | S_FEATURES_OK | S_DRIVER_OK))
        fail(what);
}

/* ---- virtio-block ---- */

#define BLK_IN 0
#define BLK_OUT 1
#define BLK_FLUSH 4
#define BLK_HDR 0x300000UL
#define BLK_DATA 0x301000UL
#define BLK_STATUS 0x302000UL

/* One request: header, optional 512-byte data buffer, status. Returns the status byte. */
static u8 blk_request(struct vq *q, u32 type, u64 sector, int with_data, char what) {
    volatile u32 *hdr = (volatile u32 *)BLK_HDR;
    hdr[0] = type;
    hdr[1] = 0;
    *(volatile u64 *)(BLK_HDR + 8) = sector;
    *(volatile u8 *)BLK_STATUS = 0xff;
    if (with_data) {
        set_desc(q, 0, BLK_HDR, 16, F_NEXT, 1);
        set_desc(q, 1, BLK_DATA, 512, (u16)(F_NEXT | (type == BLK_IN ? F_WRITE : 0)), 2);
    } else {
        set_desc(q, 0, BLK_HDR, 16, F_NEXT, 2);
    }
    set_desc(q, 2, BLK_STATUS, 1, F_WRITE, 0);
    vq_offer(q, 0);
    vq_notify(q);
    u32 written;
    if (vq_wait_used(q, &written, what) != 0)
        fail(what);
    return *(volatile u8 *)BLK_STATUS;
}

static void block_test(u64 window) {
    struct vq q;
    volatile u8 *data = (volatile u8 *)BLK_DATA;
    device_init(window, 2, &q, 1, 0x200000, 'b');
    zero(data, 512);
    copy(data, GUEST_SECTOR1, len(GUEST_SECTOR1));
    if (blk_request(&q, BLK_OUT, 1, 1, 'w') != 0)
        fail('w');
    if (blk_request(&q, BLK_FLUSH, 0, 0, 'f') != 0)
        fail('f');
    zero(data, 512);
    if (blk_request(&q, BLK_IN, 1, 1, 'r') != 0 || !same(data, GUEST_SECTOR1, len(GUEST_SECTOR1)))
        fail('r');
    zero(data, 512);
    if (blk_request(&q, BLK_IN, 0, 1, 'h') != 0 || !same(data, HOST_SECTOR0, len(HOST_SECTOR0)))
        fail('h');
    puts("test-guest: virtio-block write, flush, read back, host data ok\n");
}

/* ---- virtio-console ---- */

#define CONSOLE_BUF 0x310000UL
#define CONSOLE_RX_BUF 0x311000UL
#define CONSOLE_RX_LEN 64 /* small, so a longer line arrives in several buffers */
#define ECHO_PREFIX "test-guest: echo: "
#define LINE_MAX 200

static void console_send(struct vq *tx, const char *what, u32 n) {
    copy((volatile u8 *)CONSOLE_BUF, what, n);
    set_desc(tx, 0, CONSOLE_BUF, n, 0, 0);
    vq_offer(tx, 0);
    vq_notify(tx);
    u32 written;
    if (vq_wait_used(tx, &written, 'c') != 0)
        fail('c');
}

/* Reads one line from the receive queue, one posted buffer at a time, and sends it back
 * after ECHO_PREFIX. */
static void console_echo(struct vq *rx, struct vq *tx) {
    char line[sizeof(ECHO_PREFIX) - 1 + LINE_MAX];
    u32 n = len(ECHO_PREFIX);
    copy((volatile u8 *)line, ECHO_PREFIX, n);
    for (;;) {
        set_desc(rx, 0, CONSOLE_RX_BUF, CONSOLE_RX_LEN, F_WRITE, 0);
        vq_offer(rx, 0);
        vq_notify(rx);
        u32 got;
        if (vq_wait_used(rx, &got, 'i') != 0 || got == 0 || got > CONSOLE_RX_LEN)
            fail('i');
        volatile u8 *in = (volatile u8 *)CONSOLE_RX_BUF;
        for (u32 i = 0; i < got; i++) {
            if (n == sizeof(line))
                fail('i');
            line[n++] = (char)in[i];
            if (in[i] == '\n') {
                console_send(tx, line, n);
                puts("test-guest: virtio-console receive ok\n");
                return;
            }
        }
    }
}

static void console_test(u64 window, int echo) {
    struct vq q[2]; /* receive, transmit */
    device_init(window, 3, q, 2, 0x210000, 'c');
    console_send(&q[1], CONSOLE_LINE, len(CONSOLE_LINE));
    puts("test-guest: virtio-console transmit ok\n");
    if (echo)
        console_echo(&q[0], &q[1]);
}

/* ---- virtio-vsock ---- */

struct vsock_hdr {
    u64 src_cid;
    u64 dst_cid;
    u32 src_port;
    u32 dst_port;
    u32 len;
    u16 type;
    u16 op;
    u32 flags;
    u32 buf_alloc;
    u32 fwd_cnt;
} __attribute__((packed));

#define OP_REQUEST 1
#define OP_RESPONSE 2
#define OP_RST 3
#define OP_SHUTDOWN 4
#define OP_RW 5
#define VSOCK_RX_BUFS 0x320000UL /* QSIZE buffers of 4 KiB */
#define VSOCK_TX_BUF 0x330000UL
#define GUEST_CID 3

static void vsock_send(struct vq *tx, u16 op, const char *payload, u32 fwd_cnt, char what) {
    volatile struct vsock_hdr *h = (volatile struct vsock_hdr *)VSOCK_TX_BUF;
    u32 n = payload ? len(payload) : 0;
    h->src_cid = GUEST_CID;
    h->dst_cid = 2;
    h->src_port = VSOCK_GUEST_PORT;
    h->dst_port = VSOCK_HOST_PORT;
    h->len = n;
    h->type = 1; /* stream */
    h->op = op;
    h->flags = op == OP_SHUTDOWN ? 3 : 0;
    h->buf_alloc = 65536;
    h->fwd_cnt = fwd_cnt;
    if (n)
        copy((volatile u8 *)(VSOCK_TX_BUF + sizeof(struct vsock_hdr)), payload, n);
    set_desc(tx, 0, VSOCK_TX_BUF, (u32)sizeof(struct vsock_hdr) + n, 0, 0);
    vq_offer(tx, 0);
    vq_notify(tx);
    u32 written;
    if (vq_wait_used(tx, &written, what) != 0)
        fail(what);
}

/* The next packet for our connection; its buffer goes straight back to the device. */
static volatile struct vsock_hdr *vsock_recv(struct vq *rx, char what) {
    u32 written;
    u32 id = vq_wait_used(rx, &written, what);
    if (id >= QSIZE || written < sizeof(struct vsock_hdr))
        fail(what);
    volatile struct vsock_hdr *h = (volatile struct vsock_hdr *)(VSOCK_RX_BUFS + id * 0x1000);
    /* Copied out, so the buffer can be offered again before the caller looks at it. */
    volatile struct vsock_hdr *copy_at = (volatile struct vsock_hdr *)0x340000UL;
    for (u32 i = 0; i < written && i < 0x1000; i++)
        ((volatile u8 *)copy_at)[i] = ((volatile u8 *)h)[i];
    vq_offer(rx, (u16)id);
    vq_notify(rx);
    if (copy_at->src_port != VSOCK_HOST_PORT || copy_at->dst_port != VSOCK_GUEST_PORT)
        fail(what);
    return copy_at;
}

static void vsock_test(u64 window) {
    struct vq q[3]; /* rx, tx, event */
    device_init(window, 19, q, 3, 0x220000, 'v');
    if (*(volatile u32 *)(window + 0x100) != GUEST_CID)
        fail('v');
    for (u16 i = 0; i < QSIZE; i++) {
        set_desc(&q[0], i, VSOCK_RX_BUFS + i * 0x1000UL, 0x1000, F_WRITE, 0);
        vq_offer(&q[0], i);
    }
    vq_notify(&q[0]);

    vsock_send(&q[1], OP_REQUEST, 0, 0, 'x');
    volatile struct vsock_hdr *h = vsock_recv(&q[0], 'y');
    if (h->op != OP_RESPONSE)
        fail('y');
    vsock_send(&q[1], OP_RW, GUEST_PING, 0, 'z');
    /* Credit updates may come first; the host's data is one RW packet. */
    for (;;) {
        h = vsock_recv(&q[0], 'p');
        if (h->op == OP_RST || h->op == OP_SHUTDOWN)
            fail('p');
        if (h->op == OP_RW)
            break;
    }
    if (h->len != len(HOST_PONG) ||
        !same((volatile u8 *)h + sizeof(struct vsock_hdr), HOST_PONG, len(HOST_PONG)))
        fail('p');
    vsock_send(&q[1], OP_SHUTDOWN, 0, h->len, 's');
    puts("test-guest: virtio-vsock connect, send, receive, shutdown ok\n");
}

/* Whether `word` is on the command line the zero page points to. */
static int cmdline_has(u64 zero_page, const char *word) {
    const char *line = (const char *)(u64) * (volatile u32 *)(zero_page + 0x228);
    u32 n = len(word);
    for (const char *at = line; *at; at++) {
        u32 i = 0;
        while (i < n && at[i] == word[i])
            i++;
        if (i == n && (at[n] == ' ' || at[n] == 0) && (at == line || at[-1] == ' '))
            return 1;
    }
    return 0;
}

void guest_main(u64 zero_page) {
    puts("test-guest: I/O guest entered\n");
    /* Map 2 MiB at 0xd0000000 (uncached) for the virtio-mmio windows: PDPT[3] -> PD at
     * 0xc000, as guest64.S does. */
    u64 cr3;
    __asm__ volatile("mov %%cr3, %0" : "=r"(cr3));
    volatile u64 *pdpt = (volatile u64 *)(*(volatile u64 *)cr3 & ~0xfffUL);
    pdpt[3] = 0xc003;
    ((volatile u64 *)0xc000)[128] = 0xd0000093UL;
    __asm__ volatile("mov %0, %%cr3" ::"r"(cr3) : "memory");

    console_test(0xd0000000UL, cmdline_has(zero_page, "io_guest.echo"));
    block_test(0xd0001000UL);
    vsock_test(0xd0002000UL);

    outb(0x3f0, 123); /* the boot-complete marker */
    if (cmdline_has(zero_page, "io_guest.stay")) {
        puts("test-guest: staying\n");
        for (;;)
            __asm__ volatile("cli; hlt");
    }
    puts("test-guest: resetting\n");
    outb(0x64, 0xfe); /* i8042 reset */
}
