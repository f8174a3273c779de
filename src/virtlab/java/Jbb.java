/*
 * jbb: a server-side Java transaction workload in the role SPECjbb plays in seed 001 (vServCon's
 * Java VM): worker threads run warehouse/order-processing transactions against in-memory
 * warehouses for a fixed time, with no I/O, so what it measures is the JVM (JIT, allocation,
 * garbage collection, locks) on the CPUs and memory the environment gives it.
 *
 * The data and the transactions follow TPC-C's shape as SPECjbb2000/2005 did: per warehouse 10
 * districts of CUSTOMERS customers, a stock row for each of ITEMS items; new order, payment, order
 * status, delivery and stock level drawn from a shuffled deck of 10:10:1:1:1 (SPECjbb's mix), 1 % of
 * new orders rolled back on an unused item, 1 % of order lines supplied by another warehouse and
 * 15 % of payments for a customer of another warehouse. Money is in cents (long), so every total
 * is exact.
 *
 * The figure is transactions per second over the measured interval (after the warm-up, which
 * gives the JIT its time). After the threads stop, the final state is checked against what the
 * threads counted (TPC-C's consistency conditions and a few of our own): a run that skipped or
 * lost work cannot pass as a fast one. valid=false, and exit status 1, when any check fails.
 *
 * Usage: java -cp jbb.jar Jbb [--warehouses N] [--threads T] [--warmup-s S] [--duration-s S]
 *                             [--seed N]
 * Output: one JSON line (see report()).
 */

import java.lang.management.GarbageCollectorMXBean;
import java.lang.management.ManagementFactory;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.SplittableRandom;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicLong;

public final class Jbb {
    static final int DISTRICTS = 10;
    static final int CUSTOMERS = 300; // per district (TPC-C: 3000; smaller so a TCG guest starts fast)
    static final int ITEMS = 20_000; // SPECjbb2000's item count (TPC-C: 100,000)
    static final int RECENT_ORDERS = 100; // per district: what stock level and order status look at
    static final int STOCK_LEVEL_ORDERS = 20;
    static final long INITIAL_BALANCE = -1_000; // cents, TPC-C's -10.00
    static final String[] NAMES = {"new_order", "payment", "order_status", "delivery", "stock_level"};
    static final int NEW_ORDER = 0, PAYMENT = 1, ORDER_STATUS = 2, DELIVERY = 3, STOCK_LEVEL = 4;
    static final int[] DECK = deck(new int[] {10, 10, 1, 1, 1});

    // -------------------------------------------------------------------------- the data

    static final class Item {
        final long price; // cents

        Item(long price) {
            this.price = price;
        }
    }

    static final class Stock {
        int quantity;
        long ytd; // quantity sold
        long orderCount;
        long remoteCount;

        Stock(int quantity) {
            this.quantity = quantity;
        }
    }

    static final class Customer {
        final int id;
        final int discountBp; // basis points
        long balance = INITIAL_BALANCE;
        long ytdPayment;
        long paymentCount;
        long deliveryCount;
        Order lastOrder;

        Customer(int id, int discountBp) {
            this.id = id;
            this.discountBp = discountBp;
        }
    }

    static final class OrderLine {
        final int item;
        final int supplyWarehouse;
        final int quantity;
        final long amount;
        long deliveredAt; // 0 until delivered

        OrderLine(int item, int supplyWarehouse, int quantity, long amount) {
            this.item = item;
            this.supplyWarehouse = supplyWarehouse;
            this.quantity = quantity;
            this.amount = amount;
        }
    }

    static final class Order {
        final int id;
        final Customer customer;
        final long enteredAt;
        final OrderLine[] lines;
        final long total; // what the customer owes once delivered: lines, taxes, discount
        int carrier; // 0 until delivered

        Order(int id, Customer customer, long enteredAt, OrderLine[] lines, long total) {
            this.id = id;
            this.customer = customer;
            this.enteredAt = enteredAt;
            this.lines = lines;
            this.total = total;
        }
    }

    /** Everything of a district is guarded by the district's own monitor. */
    static final class District {
        final int taxBp;
        final Customer[] customers = new Customer[CUSTOMERS];
        final ArrayDeque<Order> undelivered = new ArrayDeque<>();
        final ArrayDeque<Order> recent = new ArrayDeque<>();
        int nextOrderId = 1;
        long ytd;

        District(int taxBp) {
            this.taxBp = taxBp;
        }
    }

    static final class Warehouse {
        final int id;
        final int taxBp;
        final District[] districts = new District[DISTRICTS];
        final Stock[] stock = new Stock[ITEMS]; // each row guarded by its own monitor
        final AtomicLong ytd = new AtomicLong();

        Warehouse(int id, SplittableRandom random) {
            this.id = id;
            this.taxBp = random.nextInt(0, 2001);
            for (int d = 0; d < DISTRICTS; d++) {
                District district = new District(random.nextInt(0, 2001));
                for (int c = 0; c < CUSTOMERS; c++) {
                    district.customers[c] = new Customer(c, random.nextInt(0, 5001));
                }
                districts[d] = district;
            }
            for (int i = 0; i < ITEMS; i++) {
                stock[i] = new Stock(random.nextInt(10, 101));
            }
        }
    }

    /** What one thread did, every phase counted (for the checks) and the measured one apart. */
    static final class Tally {
        final long[] measured = new long[NAMES.length];
        final long[] all = new long[NAMES.length];
        long rollbacks;
        long orderLines;
        long remoteLines;
        long quantityOrdered;
        long ordersDelivered;
        long deliveredAmount;
        long paymentAmount;
    }

    // -------------------------------------------------------------------------- the transactions

    final Item[] items;
    final Warehouse[] warehouses;

    Jbb(int warehouseCount, long seed) {
        SplittableRandom random = new SplittableRandom(seed);
        items = new Item[ITEMS];
        for (int i = 0; i < ITEMS; i++) {
            items[i] = new Item(random.nextLong(100, 10_001));
        }
        warehouses = new Warehouse[warehouseCount];
        for (int w = 0; w < warehouseCount; w++) {
            warehouses[w] = new Warehouse(w, random.split());
        }
    }

    /** TPC-C's non-uniform random number: some customers and items are much more popular. */
    static int nonUniform(SplittableRandom random, int a, int c, int low, int high) {
        return (((random.nextInt(0, a + 1) | random.nextInt(low, high + 1)) + c) % (high - low + 1)) + low;
    }

    int otherWarehouse(SplittableRandom random, int home) {
        if (warehouses.length == 1) {
            return home;
        }
        int other = random.nextInt(0, warehouses.length - 1);
        return other >= home ? other + 1 : other;
    }

    void newOrder(SplittableRandom random, Warehouse home, Tally tally) {
        District district = home.districts[random.nextInt(DISTRICTS)];
        int customerId = nonUniform(random, 255, 113, 0, CUSTOMERS - 1);
        int count = random.nextInt(5, 16);
        int[] itemIds = new int[count];
        int[] supply = new int[count];
        int[] quantities = new int[count];
        for (int i = 0; i < count; i++) {
            itemIds[i] = nonUniform(random, 8191, 7911, 0, ITEMS - 1);
            supply[i] = random.nextInt(100) == 0 ? otherWarehouse(random, home.id) : home.id;
            quantities[i] = random.nextInt(1, 11);
        }
        if (random.nextInt(100) == 0) {
            // An unused item number: the order is refused before it changes anything (TPC-C 2.4.2.3).
            tally.rollbacks++;
            return;
        }
        synchronized (district) {
            Customer customer = district.customers[customerId];
            OrderLine[] lines = new OrderLine[count];
            long sum = 0;
            for (int i = 0; i < count; i++) {
                Stock stock = warehouses[supply[i]].stock[itemIds[i]];
                synchronized (stock) {
                    // TPC-C's replenishment rule keeps every quantity within 10..100.
                    stock.quantity = stock.quantity >= quantities[i] + 10
                            ? stock.quantity - quantities[i]
                            : stock.quantity - quantities[i] + 91;
                    stock.ytd += quantities[i];
                    stock.orderCount++;
                    if (supply[i] != home.id) {
                        stock.remoteCount++;
                    }
                }
                long amount = quantities[i] * items[itemIds[i]].price;
                lines[i] = new OrderLine(itemIds[i], supply[i], quantities[i], amount);
                sum += amount;
                tally.quantityOrdered += quantities[i];
                tally.remoteLines += supply[i] != home.id ? 1 : 0;
            }
            long total = sum * (10_000 + home.taxBp + district.taxBp) * (10_000 - customer.discountBp)
                    / 100_000_000L;
            Order order = new Order(district.nextOrderId++, customer, System.currentTimeMillis(), lines, total);
            district.undelivered.addLast(order);
            district.recent.addLast(order);
            if (district.recent.size() > RECENT_ORDERS) {
                district.recent.removeFirst(); // garbage once delivered, as in a real order system
            }
            customer.lastOrder = order;
            tally.orderLines += count;
        }
    }

    void payment(SplittableRandom random, Warehouse home, Tally tally) {
        District district = home.districts[random.nextInt(DISTRICTS)];
        Warehouse customerHome = random.nextInt(100) < 15 ? warehouses[otherWarehouse(random, home.id)] : home;
        District customerDistrict = customerHome.districts[random.nextInt(DISTRICTS)];
        int customerId = nonUniform(random, 255, 223, 0, CUSTOMERS - 1);
        long amount = random.nextLong(100, 500_001);
        home.ytd.addAndGet(amount);
        synchronized (district) {
            district.ytd += amount;
        }
        synchronized (customerDistrict) {
            Customer customer = customerDistrict.customers[customerId];
            customer.balance -= amount;
            customer.ytdPayment += amount;
            customer.paymentCount++;
        }
        tally.paymentAmount += amount;
    }

    long orderStatus(SplittableRandom random, Warehouse home) {
        District district = home.districts[random.nextInt(DISTRICTS)];
        int customerId = nonUniform(random, 255, 17, 0, CUSTOMERS - 1);
        long seen = 0;
        synchronized (district) {
            Customer customer = district.customers[customerId];
            Order order = customer.lastOrder;
            seen += customer.balance;
            if (order != null) {
                for (OrderLine line : order.lines) {
                    seen += line.amount + line.quantity + line.deliveredAt;
                }
            }
        }
        return seen;
    }

    void delivery(SplittableRandom random, Warehouse home, Tally tally) {
        int carrier = random.nextInt(1, 11);
        long now = System.currentTimeMillis();
        for (District district : home.districts) {
            synchronized (district) {
                Order order = district.undelivered.pollFirst();
                if (order == null) {
                    continue; // nothing to deliver in this district (TPC-C skips it)
                }
                order.carrier = carrier;
                for (OrderLine line : order.lines) {
                    line.deliveredAt = now;
                }
                order.customer.balance += order.total;
                order.customer.deliveryCount++;
                tally.ordersDelivered++;
                tally.deliveredAmount += order.total;
            }
        }
    }

    int stockLevel(SplittableRandom random, Warehouse home) {
        District district = home.districts[random.nextInt(DISTRICTS)];
        int threshold = random.nextInt(10, 21);
        Set<Integer> itemIds = new HashSet<>();
        synchronized (district) {
            int skip = Math.max(0, district.recent.size() - STOCK_LEVEL_ORDERS);
            for (Order order : district.recent) {
                if (skip-- > 0) {
                    continue;
                }
                for (OrderLine line : order.lines) {
                    itemIds.add(line.item);
                }
            }
        }
        int low = 0;
        for (int item : itemIds) {
            Stock stock = home.stock[item];
            synchronized (stock) {
                low += stock.quantity < threshold ? 1 : 0;
            }
        }
        return low;
    }

    // -------------------------------------------------------------------------- the run

    /** SPECjbb's deck: the mix as cards, drawn in a freshly shuffled order. */
    static int[] deck(int[] weights) {
        int size = 0;
        for (int weight : weights) {
            size += weight;
        }
        int[] cards = new int[size];
        int next = 0;
        for (int type = 0; type < weights.length; type++) {
            for (int i = 0; i < weights[type]; i++) {
                cards[next++] = type;
            }
        }
        return cards;
    }

    static void shuffle(int[] cards, SplittableRandom random) {
        for (int i = cards.length - 1; i > 0; i--) {
            int j = random.nextInt(i + 1);
            int card = cards[i];
            cards[i] = cards[j];
            cards[j] = card;
        }
    }

    /** One worker: its home warehouses are those whose number is its own modulo the thread count. */
    Tally work(int thread, int threads, long seed, long measureFrom, long end) {
        SplittableRandom random = new SplittableRandom(seed * 1_000_003L + thread);
        List<Warehouse> homes = new ArrayList<>();
        for (int w = thread % warehouses.length; w < warehouses.length; w += threads) {
            homes.add(warehouses[w]);
        }
        Tally tally = new Tally();
        int[] cards = DECK.clone();
        int card = cards.length;
        long sink = 0; // read-only results, used so that the JIT cannot drop the reads
        for (long done = 0; ; done++) {
            long now = System.nanoTime();
            if (now >= end) {
                break;
            }
            if (card == cards.length) {
                shuffle(cards, random);
                card = 0;
            }
            int type = cards[card++];
            Warehouse home = homes.get((int) (done % homes.size()));
            switch (type) {
                case NEW_ORDER -> newOrder(random, home, tally);
                case PAYMENT -> payment(random, home, tally);
                case ORDER_STATUS -> sink += orderStatus(random, home);
                case DELIVERY -> delivery(random, home, tally);
                default -> sink += stockLevel(random, home);
            }
            tally.all[type]++;
            if (now >= measureFrom) {
                tally.measured[type]++;
            }
        }
        if (sink == Long.MIN_VALUE) {
            System.err.println("unreachable: " + sink);
        }
        return tally;
    }

    /**
     * The final state against what the threads counted; name -> whether it holds. The order and
     * payment counts are the transactions counted for the figure, so a transaction counted but not
     * done (or done twice) breaks a check.
     */
    Map<String, Boolean> check(List<Tally> tallies) {
        long orders = 0, lines = 0, remote = 0, quantity = 0, delivered = 0, deliveredAmount = 0;
        long payments = 0, paid = 0;
        for (Tally t : tallies) {
            orders += t.all[NEW_ORDER] - t.rollbacks;
            payments += t.all[PAYMENT];
            lines += t.orderLines;
            remote += t.remoteLines;
            quantity += t.quantityOrdered;
            delivered += t.ordersDelivered;
            deliveredAmount += t.deliveredAmount;
            paid += t.paymentAmount;
        }
        boolean warehouseYtd = true, quantitiesInRange = true, undeliveredUndelivered = true;
        long warehouseTotal = 0, nextIds = 0, queued = 0, balances = 0, customerPayments = 0;
        long customerDeliveries = 0, customerPaid = 0, stockYtd = 0, stockOrders = 0, stockRemote = 0;
        for (Warehouse w : warehouses) {
            long districtYtd = 0;
            for (District d : w.districts) {
                districtYtd += d.ytd;
                nextIds += d.nextOrderId - 1;
                queued += d.undelivered.size();
                for (Order order : d.undelivered) {
                    undeliveredUndelivered &= order.carrier == 0;
                }
                for (Customer c : d.customers) {
                    balances += c.balance;
                    customerPayments += c.paymentCount;
                    customerDeliveries += c.deliveryCount;
                    customerPaid += c.ytdPayment;
                }
            }
            warehouseYtd &= w.ytd.get() == districtYtd; // TPC-C consistency condition 1
            warehouseTotal += w.ytd.get();
            for (Stock s : w.stock) {
                stockYtd += s.ytd;
                stockOrders += s.orderCount;
                stockRemote += s.remoteCount;
                quantitiesInRange &= s.quantity >= 10 && s.quantity <= 100;
            }
        }
        long customerCount = (long) warehouses.length * DISTRICTS * CUSTOMERS;
        Map<String, Boolean> checks = new LinkedHashMap<>();
        checks.put("warehouse_ytd_is_sum_of_districts", warehouseYtd);
        checks.put("payments_reach_warehouses", warehouseTotal == paid);
        checks.put("payments_reach_customers", customerPayments == payments && customerPaid == paid);
        checks.put("order_ids_match_new_orders", nextIds == orders);
        checks.put("undelivered_is_ordered_minus_delivered", queued == orders - delivered && undeliveredUndelivered);
        checks.put("deliveries_reach_customers", customerDeliveries == delivered);
        checks.put("balances_add_up", balances == customerCount * INITIAL_BALANCE - paid + deliveredAmount);
        checks.put("stock_matches_order_lines", stockYtd == quantity && stockOrders == lines && stockRemote == remote);
        checks.put("stock_quantities_in_range", quantitiesInRange);
        return checks;
    }

    static Map<String, long[]> gcSnapshot() {
        Map<String, long[]> gcs = new LinkedHashMap<>();
        for (GarbageCollectorMXBean gc : ManagementFactory.getGarbageCollectorMXBeans()) {
            gcs.put(gc.getName(), new long[] {gc.getCollectionCount(), gc.getCollectionTime()});
        }
        return gcs;
    }

    // -------------------------------------------------------------------------- output

    static String quote(String text) {
        StringBuilder out = new StringBuilder("\"");
        for (char ch : text.toCharArray()) {
            switch (ch) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                case '\n' -> out.append("\\n");
                case '\r' -> out.append("\\r");
                case '\t' -> out.append("\\t");
                default -> {
                    if (ch < 0x20) {
                        out.append(String.format("\\u%04x", (int) ch));
                    } else {
                        out.append(ch);
                    }
                }
            }
        }
        return out.append('"').toString();
    }

    static String property(String name) {
        String value = System.getProperty(name);
        return value == null ? "null" : quote(value);
    }

    static String report(Options options, int threads, double measuredS, List<Tally> tallies,
            Map<String, Boolean> checks, Map<String, long[]> gcBefore, Map<String, long[]> gcAfter,
            double setupS) {
        long[] byType = new long[NAMES.length];
        long rollbacks = 0;
        StringBuilder perThread = new StringBuilder("[");
        for (Tally t : tallies) {
            long ops = 0;
            for (int type = 0; type < NAMES.length; type++) {
                byType[type] += t.measured[type];
                ops += t.measured[type];
            }
            rollbacks += t.rollbacks;
            perThread.append(perThread.length() > 1 ? "," : "").append(ops);
        }
        long ops = 0;
        StringBuilder transactions = new StringBuilder("{");
        for (int type = 0; type < NAMES.length; type++) {
            ops += byType[type];
            transactions.append(type > 0 ? "," : "").append(quote(NAMES[type])).append(':').append(byType[type]);
        }
        boolean valid = !checks.containsValue(false);
        StringBuilder checkText = new StringBuilder("{");
        for (Map.Entry<String, Boolean> entry : checks.entrySet()) {
            checkText.append(checkText.length() > 1 ? "," : "").append(quote(entry.getKey())).append(':')
                    .append(entry.getValue());
        }
        StringBuilder gc = new StringBuilder("[");
        for (Map.Entry<String, long[]> entry : gcAfter.entrySet()) {
            long[] before = gcBefore.getOrDefault(entry.getKey(), new long[] {0, 0});
            gc.append(gc.length() > 1 ? "," : "").append("{\"name\":").append(quote(entry.getKey()))
                    .append(",\"collections\":").append(entry.getValue()[0] - before[0])
                    .append(",\"time_ms\":").append(entry.getValue()[1] - before[1]).append('}');
        }
        StringBuilder args = new StringBuilder("[");
        for (String arg : ManagementFactory.getRuntimeMXBean().getInputArguments()) {
            args.append(args.length() > 1 ? "," : "").append(quote(arg));
        }
        Runtime runtime = Runtime.getRuntime();
        return "{\"benchmark\":\"virtlab-jbb\",\"format\":1"
                + ",\"warehouses\":" + options.warehouses + ",\"threads\":" + threads
                + ",\"warmup_s\":" + options.warmupS + ",\"duration_s\":" + options.durationS
                + ",\"seed\":" + options.seed + ",\"setup_s\":" + String.format("%.6f", setupS)
                + ",\"measured_s\":" + String.format("%.6f", measuredS)
                + ",\"ops\":" + ops + ",\"ops_per_s\":" + String.format("%.3f", ops / measuredS)
                + ",\"transactions\":" + transactions + "},\"rollbacks\":" + rollbacks
                + ",\"per_thread_ops\":" + perThread + "]"
                + ",\"valid\":" + valid + ",\"checks\":" + checkText + "}"
                + ",\"gc\":" + gc + "]"
                + ",\"jvm\":{\"name\":" + property("java.vm.name") + ",\"vendor\":" + property("java.vm.vendor")
                + ",\"version\":" + property("java.vm.version") + ",\"runtime\":" + property("java.runtime.version")
                + ",\"args\":" + args + "]"
                + ",\"max_heap_bytes\":" + runtime.maxMemory()
                + ",\"processors\":" + runtime.availableProcessors() + "}}";
    }

    // -------------------------------------------------------------------------- main

    static final class Options {
        int warehouses = 1;
        int threads = 0; // 0: one per warehouse (SPECjbb's rule)
        double warmupS = 10;
        double durationS = 60;
        long seed = 1;
    }

    static Options parse(String[] argv) {
        Options options = new Options();
        for (int i = 0; i < argv.length; i += 2) {
            if (i + 1 >= argv.length) {
                throw new IllegalArgumentException(argv[i] + " needs a value");
            }
            String value = argv[i + 1];
            switch (argv[i]) {
                case "--warehouses" -> options.warehouses = Integer.parseInt(value);
                case "--threads" -> options.threads = Integer.parseInt(value);
                case "--warmup-s" -> options.warmupS = Double.parseDouble(value);
                case "--duration-s" -> options.durationS = Double.parseDouble(value);
                case "--seed" -> options.seed = Long.parseLong(value);
                default -> throw new IllegalArgumentException("unknown option " + argv[i]);
            }
        }
        if (options.warehouses < 1 || options.threads < 0 || options.warmupS < 0 || options.durationS <= 0) {
            throw new IllegalArgumentException("warehouses >= 1, threads >= 0, warmup-s >= 0, duration-s > 0");
        }
        return options;
    }

    public static void main(String[] argv) throws InterruptedException {
        Options options;
        try {
            options = parse(argv);
        } catch (IllegalArgumentException error) {
            System.err.println("jbb: " + error.getMessage());
            System.err.println("usage: Jbb [--warehouses N] [--threads T] [--warmup-s S] [--duration-s S] [--seed N]");
            System.exit(2);
            return;
        }
        long setupStart = System.nanoTime();
        Jbb jbb = new Jbb(options.warehouses, options.seed);
        int threads = options.threads > 0 ? options.threads : options.warehouses;
        double setupS = (System.nanoTime() - setupStart) / 1e9;
        long start = System.nanoTime();
        long measureFrom = start + (long) (options.warmupS * 1e9);
        long end = measureFrom + (long) (options.durationS * 1e9);
        ExecutorService pool = Executors.newFixedThreadPool(threads);
        List<Future<Tally>> futures = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            final int thread = t;
            futures.add(pool.submit(() -> jbb.work(thread, threads, options.seed, measureFrom, end)));
        }
        long wait = measureFrom - System.nanoTime();
        if (wait > 0) {
            Thread.sleep(wait / 1_000_000, (int) (wait % 1_000_000));
        }
        Map<String, long[]> gcBefore = gcSnapshot();
        List<Tally> tallies = new ArrayList<>();
        try {
            for (Future<Tally> future : futures) {
                tallies.add(future.get());
            }
        } catch (ExecutionException error) {
            System.err.println("jbb: a worker failed: " + error.getCause());
            error.getCause().printStackTrace();
            System.exit(1);
        } finally {
            pool.shutdownNow();
        }
        Map<String, long[]> gcAfter = gcSnapshot();
        Map<String, Boolean> checks = jbb.check(tallies);
        double measuredS = (end - measureFrom) / 1e9;
        System.out.println(report(options, threads, measuredS, tallies, checks, gcBefore, gcAfter, setupS));
        System.exit(checks.containsValue(false) ? 1 : 0);
    }
}
